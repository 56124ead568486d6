//! One seed's three runs and the checks between them.
//!
//! 1. **Direct** (cache on): the scheduler core over its own cache (`kvtier_fsm::Scheduler`),
//!    the device with the oracle engine and the L3 core called in place, in the order
//!    the actors' conversation uses. `check_invariants` runs after every call (exact page
//!    conservation against every request, tree structure, locks). It decides the client
//!    aborts that depend on the scheduler's state, which only this path can see.
//! 2. **Cache on** through the actors on the deterministic runtime, with the same faults
//!    and bus delays and reorderings on top: it replays the direct run's aborts at the
//!    same steps, and every plan must equal the direct run's plan at that step. Equal
//!    plans from equal inputs mean equal scheduler states, so the direct run's invariant
//!    checks hold for this run's states too; its own shutdown checks conservation again.
//! 3. **Cache off** through the actors: no prefix cache, no host cache, no L3, only the
//!    bus faults (the others change what is computed). It aborts each request the direct
//!    run aborted at the same progress: after as many generated tokens (or, with none,
//!    at its first row or at submit).
//!
//! Then: no integrity error in any run, identical answers (a request finished in both
//! has the same tokens; one aborted by the client in one is aborted in the other with
//! the same tokens; one the scheduler aborted is compared as a prefix), a clean
//! shutdown, and, on the direct path, every page free once the cache is cleared.

mod driver;
mod sut;

use std::collections::BTreeMap;
use std::sync::Arc;

use driver::drive;
use kvtier::KvError;
use kvtier_device::DeviceCore;
use kvtier_fsm::Scheduler;
use kvtier_types::{AbortReason, KvEvent, Token};
use sut::{Direct, Sut, build};

use crate::api::{Path, system_with_hooks};
use crate::campaign::coverage::Coverage;
use crate::campaign::faults::{BusChaos, FaultKind, FaultRates, FaultTally, LateAcks};
use crate::campaign::spec::{RunSpec, longest_prompt};
use crate::campaign::{CampaignError, Check, Failure, RunKind, SeedReport};
use crate::oracle::OracleEngine;

/// When, within a step, a client abort is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Moment {
    AfterSubmit,
    BeforeAdvance,
    AfterAdvance,
}

/// A client abort as the direct run made it.
#[derive(Debug, Clone)]
struct Fired {
    step: u64,
    moment: Moment,
    request: usize,
    /// Tokens the request had generated (and `advance` had taken) by then.
    tokens: usize,
}

/// How the cache-off run aborts a request the direct run aborted.
#[derive(Debug, Clone, Copy)]
enum AtProgress {
    Submit,
    /// Before the `advance` of its first plan with a row for it.
    FirstRow,
    /// After the `advance` that delivered its `n`-th token.
    Tokens(usize),
}

/// How a run decides its client aborts.
enum Aborts<'a> {
    /// From the drawn points and the scheduler's states (the direct run).
    Decide,
    /// The direct run's, at the same steps (the cache-on actors run).
    Replay(&'a [Fired]),
    /// At the same progress as in the direct run (the cache-off run).
    Progress(BTreeMap<usize, AtProgress>),
}

/// What became of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// Not submitted yet, or never: a follow-up whose parent did not finish.
    NotSubmitted,
    /// Refused at submit (the reason's text).
    Refused(String),
    Live,
    Finished,
    ClientAborted,
    SchedulerAborted(AbortReason),
}

#[derive(Debug, Clone)]
struct Life {
    outcome: Outcome,
    prompt: Vec<Token>,
    /// Tokens delivered to `advance`.
    tokens: Vec<Token>,
    /// Its first prompt row (whose prefix the cache served) was seen.
    started: bool,
    /// Leading pages of its prompt and tokens readable on host, after the last call
    /// (the direct path).
    host_pages: u32,
    abort_done: bool,
}

/// What one run leaves for the comparisons.
#[derive(Debug)]
struct RunRecord {
    lives: Vec<Life>,
    digests: Vec<u64>,
    fired: Vec<Fired>,
    kv_events: Vec<KvEvent>,
    coverage: Coverage,
}

/// Why a run stopped early.
enum Stop {
    Failed(Failure),
    Error(CampaignError),
}

impl From<CampaignError> for Stop {
    fn from(e: CampaignError) -> Self {
        Stop::Error(e)
    }
}

fn fail(check: Check, run: RunKind, step: Option<u64>, detail: String) -> Stop {
    Stop::Failed(Failure {
        check,
        run,
        step,
        detail,
    })
}

/// Runs every check of one spec.
pub(super) fn run_spec(spec: &RunSpec) -> Result<SeedReport, CampaignError> {
    spec.validate()?;
    match run_checked(spec) {
        Ok(coverage) => Ok(SeedReport {
            seed: spec.seed,
            coverage,
            failure: None,
        }),
        Err(Stop::Failed(failure)) => Ok(SeedReport {
            seed: spec.seed,
            coverage: Coverage::default(),
            failure: Some(failure),
        }),
        Err(Stop::Error(e)) => Err(e),
    }
}

fn run_checked(spec: &RunSpec) -> Result<Coverage, Stop> {
    let direct = run_direct(spec)?;
    let on_tally = Arc::new(FaultTally::default());
    let on = run_actors(
        spec,
        true,
        Aborts::Replay(&direct.fired),
        &direct,
        &on_tally,
    )?;
    let off_tally = Arc::new(FaultTally::default());
    let progress = progress_aborts(&direct);
    let off = run_actors(spec, false, Aborts::Progress(progress), &direct, &off_tally)?;
    compare_answers(spec, &on, &off)?;
    let mut coverage = direct.coverage;
    for kind in FaultKind::ALL {
        coverage.add(kind.name(), on_tally.count(kind) + off_tally.count(kind));
    }
    Ok(coverage)
}

/// The direct run: invariants after every call, and the client aborts decided.
fn run_direct(spec: &RunSpec) -> Result<RunRecord, Stop> {
    // Its fault counts are the cache-on actors run's, counted there.
    let tally = Arc::new(FaultTally::default());
    let (device, l3, _dir) = build(spec, true, &tally)?;
    let scheduler = Scheduler::new(spec.config(true))
        .map_err(|e| CampaignError::Spec(format!("config: {e}")))?;
    let mut direct = Direct {
        scheduler,
        device,
        l3,
    };
    let kind = RunKind::Direct;
    let late = LateAcks::new(spec.seed, &spec.faults, &tally);
    let mut record = drive(spec, kind, &mut direct, Aborts::Decide, None, late)?;
    engine_clean(kind, &direct.device)?;
    let s = &mut direct.scheduler;
    if let Err(e) = s.check_invariants() {
        return Err(fail(
            Check::Invariant,
            kind,
            None,
            format!("at the end: {e}"),
        ));
    }
    let stats = s.stats();
    let coverage = &mut record.coverage;
    coverage.add("retraction", stats.retractions);
    coverage.add("recompute (host full, or deadlock)", stats.recomputes);
    coverage.add("stale events ignored", stats.stale_events);
    coverage.add(
        "load-back failed, readers requeued",
        stats.load_back_requeues,
    );
    if let Some(l3) = &direct.l3 {
        let l3 = l3.stats();
        coverage.add("L3 lookup hit (pages)", l3.lookup_hit_pages);
        coverage.add("L3 failed prefetch", l3.failed_prefetches);
        coverage.add("L3 backup", l3.backup_ops);
        coverage.add("L3 failed backup", l3.failed_backups);
    }
    // Quiescent: once the cache lets go, every page of both pools is free.
    let s = &mut direct.scheduler;
    s.clear_cache();
    let stats = s.stats();
    let config = s.config();
    let free = [stats.available_device_pages, stats.available_host_pages];
    let usable = [config.usable_device_pages(), config.usable_host_pages()];
    if free != usable || !s.request_ids().is_empty() {
        return Err(fail(
            Check::Leak,
            kind,
            None,
            format!(
                "after clearing the cache: free pages {free:?} of {usable:?}, live requests \
                 {:?}",
                s.request_ids()
            ),
        ));
    }
    Ok(record)
}

/// A run through the actors on the deterministic runtime: cache on (replaying the
/// direct run's aborts, its plans equal to the direct run's) or off.
fn run_actors(
    spec: &RunSpec,
    cache: bool,
    aborts: Aborts,
    direct: &RunRecord,
    tally: &Arc<FaultTally>,
) -> Result<RunRecord, Stop> {
    let kind = if cache {
        RunKind::CacheOn
    } else {
        RunKind::CacheOff
    };
    let (device, l3, _dir) = build(spec, cache, tally)?;
    let rates: FaultRates = if cache {
        spec.faults.clone()
    } else {
        spec.faults.bus_only()
    };
    let hooks = BusChaos::new(spec.seed, &rates, tally);
    let late = LateAcks::new(spec.seed, &rates, tally);
    let system_error =
        |what: &str, e: KvError| fail(Check::System, kind, None, format!("{what}: {e}"));
    let mut s = system_with_hooks(
        Path::Deterministic,
        spec.config(cache),
        Some(device),
        l3,
        hooks,
    )
    .map_err(|e| system_error("start", e))?;
    let expected = cache.then_some(direct.digests.as_slice());
    let mut record = drive(spec, kind, &mut s, aborts, expected, late)?;
    if cache {
        if record.digests.len() != direct.digests.len() {
            return Err(fail(
                Check::PathDivergence,
                kind,
                None,
                format!(
                    "{} plans through the actors, {} on the direct path",
                    record.digests.len(),
                    direct.digests.len()
                ),
            ));
        }
        record.kv_events = s
            .take_kv_events()
            .map_err(|e| system_error("take_kv_events", e))?;
        if record.kv_events != direct.kv_events {
            return Err(fail(
                Check::PathDivergence,
                kind,
                None,
                format!(
                    "{} KV events through the actors, {} on the direct path (or they differ)",
                    record.kv_events.len(),
                    direct.kv_events.len()
                ),
            ));
        }
        let same = record
            .lives
            .iter()
            .zip(&direct.lives)
            .all(|(a, d)| a.outcome == d.outcome && a.tokens == d.tokens);
        if !same {
            return Err(fail(
                Check::PathDivergence,
                kind,
                None,
                "the same plans gave other answers than on the direct path".into(),
            ));
        }
    }
    let device = s
        .take_device()
        .map_err(|e| system_error("take_device", e))?
        .ok_or_else(|| system_error("take_device", KvError::NoDevice))?;
    engine_clean(kind, &device)?;
    let report = s.shutdown().map_err(|e| system_error("shutdown", e))?;
    if !report.is_clean() {
        return Err(fail(Check::Leak, kind, None, format!("{report:?}")));
    }
    Ok(record)
}

/// The oracle engine found no integrity error.
fn engine_clean(kind: RunKind, device: &DeviceCore) -> Result<(), Stop> {
    let Some(engine) = OracleEngine::of(device) else {
        return Err(fail(
            Check::System,
            kind,
            None,
            "the device has no oracle engine".into(),
        ));
    };
    match engine.errors.first() {
        None => Ok(()),
        Some(first) => Err(fail(
            Check::Integrity,
            kind,
            None,
            format!(
                "{} integrity errors, the first: {first:?}",
                engine.errors.len()
            ),
        )),
    }
}

/// The cache-off run's aborts: each request the direct run aborted before it finished,
/// at the same progress.
fn progress_aborts(direct: &RunRecord) -> BTreeMap<usize, AtProgress> {
    direct
        .fired
        .iter()
        .filter(|f| direct.lives[f.request].outcome == Outcome::ClientAborted)
        .map(|f| {
            let at = match (f.moment, f.tokens) {
                (Moment::AfterSubmit, _) => AtProgress::Submit,
                (_, 0) => AtProgress::FirstRow,
                (_, n) => AtProgress::Tokens(n),
            };
            (f.request, at)
        })
        .collect()
}

/// Steps after which a run counts as stalled: far more than any drawn run needs (each
/// step computes at least one token of some request, but for retractions).
fn stall_limit(spec: &RunSpec) -> u64 {
    let tokens: u64 = (0..spec.requests.len())
        .map(|i| {
            longest_prompt(&spec.requests, &spec.bases, i) + u64::from(spec.requests[i].max_new)
        })
        .sum();
    200 + 4 * tokens
}

/// Compares the cache-on and cache-off answers request by request.
fn compare_answers(spec: &RunSpec, on: &RunRecord, off: &RunRecord) -> Result<(), Stop> {
    let differ = |i: usize, a: &Life, b: &Life, why: &str| {
        let show = |l: &Life| {
            format!(
                "{:?} with {} tokens {:?}",
                l.outcome,
                l.tokens.len(),
                l.tokens
            )
        };
        let name = spec.requests.get(i).map_or("?", |r| r.name.as_str());
        fail(
            Check::Answers,
            RunKind::CacheOff,
            None,
            format!("{name} {why}: cache on {}, cache off {}", show(a), show(b)),
        )
    };
    for (i, (a, b)) in on.lives.iter().zip(&off.lives).enumerate() {
        use Outcome::*;
        match (&a.outcome, &b.outcome) {
            // A follow-up whose parent answered in one run only.
            (NotSubmitted, _) | (_, NotSubmitted) => {}
            (Refused(x), Refused(y)) if x == y => {}
            (Refused(_), _) | (_, Refused(_)) => {
                return Err(differ(i, a, b, "was refused in one run"));
            }
            (Finished, Finished) | (ClientAborted, ClientAborted) => {
                if a.tokens != b.tokens {
                    return Err(differ(i, a, b, "answered differently"));
                }
            }
            (ClientAborted, Finished) | (Finished, ClientAborted) => {
                return Err(differ(i, a, b, "was aborted by the client in one run only"));
            }
            // The scheduler's own aborts depend on the pools' state, not on the
            // request's progress: what both generated must agree.
            _ => {
                let n = a.tokens.len().min(b.tokens.len());
                if a.tokens[..n] != b.tokens[..n] {
                    return Err(differ(i, a, b, "generated different tokens"));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(lives: &[(Outcome, &[Token])]) -> RunRecord {
        RunRecord {
            lives: lives
                .iter()
                .map(|(outcome, tokens)| Life {
                    outcome: outcome.clone(),
                    prompt: vec![1],
                    tokens: tokens.to_vec(),
                    started: true,
                    host_pages: 0,
                    abort_done: false,
                })
                .collect(),
            digests: Vec::new(),
            fired: Vec::new(),
            kv_events: Vec::new(),
            coverage: Coverage::default(),
        }
    }

    fn compare(on: (Outcome, &[Token]), off: (Outcome, &[Token])) -> Option<Check> {
        let mut spec = RunSpec::draw(0);
        spec.requests.truncate(1);
        match compare_answers(&spec, &record(&[on]), &record(&[off])) {
            Ok(()) => None,
            Err(Stop::Failed(failure)) => Some(failure.check),
            Err(Stop::Error(e)) => panic!("{e}"),
        }
    }

    #[test]
    fn answers_are_compared_as_far_as_both_runs_got() {
        use Outcome::*;
        let answers = Some(Check::Answers);
        assert_eq!(compare((Finished, &[1, 2]), (Finished, &[1, 2])), None);
        assert_eq!(compare((Finished, &[1, 2]), (Finished, &[1, 3])), answers);
        assert_eq!(compare((Finished, &[1, 2]), (Finished, &[1])), answers);
        // The client aborts at the same progress in both runs.
        assert_eq!(compare((ClientAborted, &[4]), (ClientAborted, &[4])), None);
        assert_eq!(
            compare((ClientAborted, &[4]), (ClientAborted, &[4, 5])),
            answers
        );
        assert_eq!(compare((ClientAborted, &[4]), (Finished, &[4, 5])), answers);
        // The scheduler's aborts depend on the pools: only a common prefix is owed.
        let host = SchedulerAborted(AbortReason::HostPoolExhausted);
        assert_eq!(compare((host.clone(), &[7]), (Finished, &[7, 8])), None);
        assert_eq!(compare((Finished, &[7, 8]), (host.clone(), &[])), None);
        assert_eq!(compare((host.clone(), &[6]), (Finished, &[7, 8])), answers);
        assert_eq!(compare((host, &[7]), (ClientAborted, &[7, 8])), None);
        // A follow-up submitted in one run only, and refusals.
        assert_eq!(compare((NotSubmitted, &[]), (Finished, &[1])), None);
        let refused = || Refused("too long".into());
        assert_eq!(compare((refused(), &[]), (refused(), &[])), None);
        assert_eq!(compare((refused(), &[]), (Finished, &[1])), answers);
    }
}
