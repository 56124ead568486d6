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

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use kvtier::{KvError, LocalSystem};
use kvtier_device::{DeviceCore, NewRequest};
use kvtier_fsm::{SchedError, Scheduler, StateKind};
use kvtier_l3::{L3Core, LocalStore, LocalStoreConfig};
use kvtier_types::{
    AbortReason, EngineEvent, ExecutionPlan, KvEvent, Medium, OpId, RequestId, RequestSpec,
    RowKind, Token,
};

use super::coverage::{self, Coverage};
use super::faults::{
    BusChaos, CampaignCopyFaults, CampaignL3Faults, FaultKind, FaultRates, FaultTally, LateAcks,
};
use super::spec::{AbortPoint, Prefix, RunSpec, longest_prompt};
use super::{CampaignError, Check, Failure, RunKind, SeedReport};
use crate::api::{Path, system_with_hooks};
use crate::oracle::OracleEngine;
use crate::scenario::{l3_core_over, oracle_device, scratch_dir};

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

/// The system a run drives: the actors, or the direct path.
trait Sut {
    fn submit(&mut self, specs: Vec<RequestSpec>) -> Result<(), KvError>;
    fn next_plan(&mut self) -> Result<ExecutionPlan, KvError>;
    fn execute(
        &mut self,
        plan: ExecutionPlan,
        new: Vec<NewRequest>,
    ) -> Result<Vec<EngineEvent>, KvError>;
    fn advance(&mut self, events: Vec<EngineEvent>) -> Result<(), KvError>;
    fn abort(&mut self, id: RequestId) -> Result<(), KvError>;
    fn idle(&mut self) -> Result<bool, KvError>;
    /// The request's state (the direct path only).
    fn state(&self, _id: &RequestId) -> Option<StateKind> {
        None
    }
    /// The scheduler invariants after a call (the direct path only).
    fn check(&mut self) -> Result<(), String> {
        Ok(())
    }
    /// Leading pages of `tokens` readable on host in the cache (the direct path only).
    fn host_pages(&self, _tokens: &[Token]) -> Option<u32> {
        None
    }
    /// KV events since the last call (the direct path only; the actors' are taken once,
    /// at the end, and compared with these).
    fn kv_events(&mut self) -> Vec<KvEvent> {
        Vec::new()
    }
}

impl Sut for LocalSystem {
    fn submit(&mut self, specs: Vec<RequestSpec>) -> Result<(), KvError> {
        // Every plan must equal the direct run's: lookups answer before the next one.
        self.submit_settled(specs)
    }

    fn next_plan(&mut self) -> Result<ExecutionPlan, KvError> {
        LocalSystem::next_plan(self)
    }

    fn execute(
        &mut self,
        plan: ExecutionPlan,
        new: Vec<NewRequest>,
    ) -> Result<Vec<EngineEvent>, KvError> {
        LocalSystem::execute(self, plan, new)
    }

    fn advance(&mut self, events: Vec<EngineEvent>) -> Result<(), KvError> {
        LocalSystem::advance(self, events)
    }

    fn abort(&mut self, id: RequestId) -> Result<(), KvError> {
        LocalSystem::abort(self, id)
    }

    fn idle(&mut self) -> Result<bool, KvError> {
        Ok(self.stats()?.scheduler.idle)
    }
}

/// The direct path: the scheduler over its own cache, the device and the L3 core called
/// in place.
struct Direct {
    scheduler: Scheduler,
    device: DeviceCore,
    l3: Option<L3Core>,
}

impl Sut for Direct {
    fn submit(&mut self, mut specs: Vec<RequestSpec>) -> Result<(), KvError> {
        // As the conversation does: the prompts are looked up in L3 first.
        let config = self.scheduler.config();
        let (lookup, threshold) = (config.l3_prefetch_enabled(), config.prefetch_threshold);
        if lookup && let Some(l3) = &mut self.l3 {
            l3.lookup(&mut specs, threshold);
        }
        Ok(self.scheduler.submit(specs)?)
    }

    fn next_plan(&mut self) -> Result<ExecutionPlan, KvError> {
        Ok(self.scheduler.next_plan())
    }

    fn execute(
        &mut self,
        plan: ExecutionPlan,
        new: Vec<NewRequest>,
    ) -> Result<Vec<EngineEvent>, KvError> {
        // As the conversation does: the L3 store's mail goes first; the device's events
        // come first.
        let l3_events = match &mut self.l3 {
            Some(l3) if !(plan.prefetches.is_empty() && plan.backups.is_empty()) => {
                l3.transfer(&plan.prefetches, &plan.backups)
            }
            _ => Vec::new(),
        };
        let mut events = self.device.execute(&plan, &new)?;
        events.extend(l3_events);
        Ok(events)
    }

    fn advance(&mut self, events: Vec<EngineEvent>) -> Result<(), KvError> {
        Ok(self.scheduler.advance(events)?)
    }

    fn abort(&mut self, id: RequestId) -> Result<(), KvError> {
        Ok(self.scheduler.abort(&id)?)
    }

    fn idle(&mut self) -> Result<bool, KvError> {
        Ok(self.scheduler.is_idle())
    }

    fn state(&self, id: &RequestId) -> Option<StateKind> {
        self.scheduler.request_state(id)
    }

    fn check(&mut self) -> Result<(), String> {
        self.scheduler.check_invariants().map_err(|e| e.to_string())
    }

    fn host_pages(&self, tokens: &[Token]) -> Option<u32> {
        Some(self.scheduler.cache().probe(tokens).host_pages)
    }

    fn kv_events(&mut self) -> Vec<KvEvent> {
        self.scheduler.drain_kv_events()
    }
}

/// The device, the L3 core (cache on, when drawn) and the store's directory of a run.
fn build(
    spec: &RunSpec,
    cache: bool,
    tally: &Arc<FaultTally>,
) -> Result<(DeviceCore, Option<L3Core>, Option<tempfile::TempDir>), CampaignError> {
    let mut device = oracle_device(
        spec.page_size,
        spec.device_pages,
        spec.host_pages,
        spec.verify,
    )?;
    if cache {
        device = device.with_faults(Box::new(CampaignCopyFaults::new(
            spec.seed,
            &spec.faults,
            tally,
        )));
    }
    let Some(l3) = spec.l3.as_ref().filter(|_| cache) else {
        return Ok((device, None, None));
    };
    let dir = scratch_dir("campaign-l3")?;
    let arena = device.arenas_mut().host_arena();
    let page_bytes = arena.page_bytes() as u64;
    let mut config = LocalStoreConfig::new(
        dir.path(),
        u64::from(l3.memory_pages) * page_bytes,
        match l3.disk_pages {
            0 => 1 << 30,
            pages => u64::from(pages) * page_bytes,
        },
    );
    config.prefetch_workers = 1;
    let store = LocalStore::open(config).map_err(|e| CampaignError::Setup(e.to_string()))?;
    let core = l3_core_over(Box::new(store), "kvtier-campaign", spec.page_size, arena)?
        .with_faults(Box::new(CampaignL3Faults::new(
            spec.seed,
            &spec.faults,
            tally,
            page_bytes as usize,
        )));
    Ok((device, Some(core), Some(dir)))
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

/// Empty plans in a row, with nothing left to submit, after which a run counts as
/// stalled: the next plan would be the same.
const EMPTY_PLANS: u32 = 50;

/// Drives one run to quiescence, checking each plan as it goes.
fn drive(
    spec: &RunSpec,
    kind: RunKind,
    sut: &mut dyn Sut,
    aborts: Aborts,
    expected: Option<&[u64]>,
    late: LateAcks,
) -> Result<RunRecord, Stop> {
    let mut d = Driver {
        spec,
        kind,
        sut,
        aborts,
        late,
        held: Vec::new(),
        step: 0,
        lives: vec![
            Life {
                outcome: Outcome::NotSubmitted,
                prompt: Vec::new(),
                tokens: Vec::new(),
                started: false,
                host_pages: 0,
                abort_done: false,
            };
            spec.requests.len()
        ],
        index: spec
            .requests
            .iter()
            .enumerate()
            .map(|(i, r)| (RequestId::from(r.name.as_str()), i))
            .collect(),
        record: RunRecord {
            lives: Vec::new(),
            digests: Vec::new(),
            fired: Vec::new(),
            kv_events: Vec::new(),
            coverage: Coverage::default(),
        },
        rows: BTreeSet::new(),
        prefetches: BTreeMap::new(),
        ids: spec
            .requests
            .iter()
            .map(|r| RequestId::from(r.name.as_str()))
            .collect(),
        state_aborts_fired: vec![false; spec.first_in_state.len()],
    };
    d.run(expected)?;
    d.record.lives = d.lives;
    Ok(d.record)
}

struct Driver<'a> {
    spec: &'a RunSpec,
    kind: RunKind,
    sut: &'a mut dyn Sut,
    aborts: Aborts<'a>,
    /// Which acknowledgements the engine holds back.
    late: LateAcks,
    /// Acknowledgements held back: the step they are delivered at, in arrival order.
    held: Vec<(u64, EngineEvent)>,
    step: u64,
    lives: Vec<Life>,
    index: BTreeMap<RequestId, usize>,
    record: RunRecord,
    /// Requests with a row in the current plan.
    rows: BTreeSet<usize>,
    /// Prefetches in flight: pages asked for.
    prefetches: BTreeMap<OpId, usize>,
    /// The requests' ids, by index.
    ids: Vec<RequestId>,
    /// Which of the spec's first-in-state aborts were made.
    state_aborts_fired: Vec<bool>,
}

impl Driver<'_> {
    fn fail(&self, check: Check, detail: String) -> Stop {
        fail(check, self.kind, Some(self.step), detail)
    }

    fn system(&self, what: &str, e: KvError) -> Stop {
        self.fail(Check::System, format!("{what}: {e}"))
    }

    /// The invariants after a call, and the KV events it caused.
    fn checked(&mut self, after: &str) -> Result<(), Stop> {
        if let Err(e) = self.sut.check() {
            return Err(self.fail(Check::Invariant, format!("after {after}: {e}")));
        }
        let events = self.sut.kv_events();
        let removed = events
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    KvEvent::BlockRemoved {
                        medium: Medium::Device,
                        ..
                    }
                )
            })
            .count();
        self.record.coverage.add("device eviction", removed as u64);
        self.record.kv_events.extend(events);
        // Readable host pages leave the tree only by eviction: every page in it holds
        // some request's tokens, so a request's host match shrinks when one goes.
        if self.sut.host_pages(&[]).is_none() {
            return Ok(());
        }
        let mut evicted = false;
        for life in &mut self.lives {
            if matches!(life.outcome, Outcome::NotSubmitted | Outcome::Refused(_)) {
                continue;
            }
            let sequence = [life.prompt.as_slice(), life.tokens.as_slice()].concat();
            if let Some(pages) = self.sut.host_pages(&sequence) {
                evicted |= pages < life.host_pages;
                life.host_pages = pages;
            }
        }
        self.record
            .coverage
            .add("host eviction", u64::from(evicted));
        Ok(())
    }

    /// The request a plan names in `what`, which only a live request may get.
    fn live(&self, id: &RequestId, what: &str) -> Result<usize, Stop> {
        let i = self.request(id)?;
        match &self.lives[i].outcome {
            Outcome::Live => Ok(i),
            other => Err(self.fail(
                Check::Protocol,
                format!("{what} for {id}, which is {other:?}"),
            )),
        }
    }

    fn request(&self, id: &RequestId) -> Result<usize, Stop> {
        self.index
            .get(id)
            .copied()
            .ok_or_else(|| self.fail(Check::Protocol, format!("{id} was never submitted")))
    }

    fn run(&mut self, expected: Option<&[u64]>) -> Result<(), Stop> {
        let limit = stall_limit(self.spec);
        let mut empty_plans = 0;
        loop {
            let new_requests = self.arrivals()?;
            let plan = self
                .sut
                .next_plan()
                .map_err(|e| self.system("next_plan", e))?;
            self.checked("next_plan")?;
            if plan.is_empty()
                && !self.to_come()
                && self.sut.idle().map_err(|e| self.system("stats", e))?
            {
                let lost: Vec<&str> = self
                    .lives
                    .iter()
                    .zip(&self.spec.requests)
                    .filter(|(l, _)| l.outcome == Outcome::Live)
                    .map(|(_, r)| r.name.as_str())
                    .collect();
                if lost.is_empty() {
                    return Ok(());
                }
                return Err(self.fail(
                    Check::Protocol,
                    format!("the scheduler is idle, but never finished or aborted {lost:?}"),
                ));
            }
            if self.step >= limit {
                return Err(self.fail(
                    Check::Stalled,
                    format!(
                        "no quiescence after {limit} steps; live requests {}",
                        self.live_requests()
                    ),
                ));
            }
            empty_plans = if plan.is_empty() && !self.to_come() {
                empty_plans + 1
            } else {
                0
            };
            if empty_plans >= EMPTY_PLANS {
                return Err(self.fail(
                    Check::Stalled,
                    format!(
                        "{EMPTY_PLANS} empty plans in a row; live requests {}",
                        self.live_requests()
                    ),
                ));
            }
            self.plan(&plan, expected)?;
            let events = self
                .sut
                .execute(plan, new_requests)
                .map_err(|e| self.system("execute", e))?;
            let events = self.hold_back(events);
            self.aborts_at(Moment::BeforeAdvance)?;
            self.events(&events)?;
            self.sut
                .advance(events)
                .map_err(|e| self.system("advance", e))?;
            self.checked("advance")?;
            self.aborts_at(Moment::AfterAdvance)?;
            self.step += 1;
        }
    }

    /// The live requests, with their states (where known) and the pages their history
    /// needs next (its tokens and one to decode) against the device pool.
    fn live_requests(&self) -> String {
        let ps = u64::from(self.spec.page_size);
        let usable = self.spec.device_pages.saturating_sub(1);
        let live: Vec<String> = self
            .lives
            .iter()
            .zip(&self.ids)
            .filter(|(l, _)| l.outcome == Outcome::Live)
            .map(|(l, id)| {
                let history = (l.prompt.len() + l.tokens.len()) as u64;
                let state = self
                    .sut
                    .state(id)
                    .map_or(String::new(), |s| format!("{s:?}, "));
                format!(
                    "{id} ({state}{history} tokens, {} pages)",
                    (history + 1).div_ceil(ps)
                )
            })
            .collect();
        format!("[{}] of a {usable}-page device pool", live.join(", "))
    }

    /// Whether a request is still to be submitted: not yet due, or a follow-up whose
    /// parent may still answer (parents come first, so one pass settles chains).
    fn to_come(&self) -> bool {
        let mut never = vec![false; self.lives.len()];
        let mut to_come = false;
        for i in 0..self.lives.len() {
            if self.lives[i].outcome != Outcome::NotSubmitted {
                continue;
            }
            never[i] = self.parent(i).is_some_and(|p| {
                never[p]
                    || matches!(
                        self.lives[p].outcome,
                        Outcome::Refused(_) | Outcome::ClientAborted | Outcome::SchedulerAborted(_)
                    )
            });
            to_come |= !never[i];
        }
        to_come
    }

    fn parent(&self, i: usize) -> Option<usize> {
        match &self.spec.requests[i].prefix {
            Prefix::Follows(name) => self.index.get(&RequestId::from(name.as_str())).copied(),
            _ => None,
        }
    }

    /// Submits the requests due at this step; returns them for the engine.
    fn arrivals(&mut self) -> Result<Vec<NewRequest>, Stop> {
        let mut specs = Vec::new();
        let mut due = Vec::new();
        for i in 0..self.spec.requests.len() {
            let r = &self.spec.requests[i];
            if self.lives[i].outcome != Outcome::NotSubmitted || u64::from(r.arrival) > self.step {
                continue;
            }
            let mut prompt = Vec::new();
            if let Some(p) = self.parent(i) {
                match self.lives[p].outcome {
                    Outcome::Finished => {
                        prompt.extend_from_slice(&self.lives[p].prompt);
                        prompt.extend_from_slice(&self.lives[p].tokens);
                    }
                    // Not yet answered, or never will be (then it is never submitted).
                    _ => continue,
                }
            }
            prompt.extend(self.spec.own_prompt(i).unwrap_or_default());
            specs.push(RequestSpec::new(r.name.as_str(), prompt.clone()));
            self.lives[i].prompt = prompt;
            due.push(i);
        }
        if specs.is_empty() {
            return Ok(Vec::new());
        }
        let mut refused = BTreeMap::new();
        match self.sut.submit(specs) {
            Ok(()) => {}
            Err(KvError::Batch(batch)) => {
                for r in batch.rejected {
                    // A drawn prompt is never empty or a duplicate: only its length can
                    // be refused.
                    if !matches!(r.error, SchedError::PromptTooLong { .. }) {
                        return Err(self.fail(Check::Protocol, format!("submit: {}", r.error)));
                    }
                    refused.insert(r.index, r.error.to_string());
                }
            }
            Err(e) => return Err(self.system("submit", e)),
        }
        self.checked("submit")?;
        let mut new_requests = Vec::new();
        for (k, &i) in due.iter().enumerate() {
            if let Some(reason) = refused.get(&k) {
                self.lives[i].outcome = Outcome::Refused(reason.clone());
                self.record
                    .coverage
                    .add("submit refused (prompt too long)", 1);
                continue;
            }
            self.lives[i].outcome = Outcome::Live;
            new_requests.push(NewRequest {
                id: RequestId::from(self.spec.requests[i].name.as_str()),
                prompt: self.lives[i].prompt.clone(),
                max_new_tokens: self.spec.requests[i].max_new as usize,
            });
        }
        self.aborts_at(Moment::AfterSubmit)?;
        Ok(new_requests)
    }

    /// Checks a plan against the direct run's and the requests' lives, and counts it.
    fn plan(&mut self, plan: &ExecutionPlan, expected: Option<&[u64]>) -> Result<(), Stop> {
        let mut hasher = std::hash::DefaultHasher::new();
        plan.hash(&mut hasher);
        let digest = hasher.finish();
        if let Some(expected) = expected
            && expected.get(self.record.digests.len()) != Some(&digest)
        {
            return Err(self.fail(
                Check::PathDivergence,
                "the actors' plan differs from the direct path's".into(),
            ));
        }
        self.record.digests.push(digest);
        for notice in &plan.aborted {
            let i = self.live(&notice.request_id, "an abort notice")?;
            self.lives[i].outcome = Outcome::SchedulerAborted(notice.reason);
            let metric = match notice.reason {
                AbortReason::ExceedsDevicePool => "scheduler abort: exceeds device pool",
                AbortReason::HostPoolExhausted => "scheduler abort: host pool exhausted",
                AbortReason::StateLost => "scheduler abort: recurrent state lost",
                AbortReason::ExceedsGroupPool => "scheduler abort: exceeds a group pool",
            };
            self.record.coverage.add(metric, 1);
        }
        self.rows.clear();
        for row in &plan.forward.rows {
            let i = self.live(&row.request_id, "a row")?;
            self.rows.insert(i);
            if row.kind == RowKind::Prefill && !self.lives[i].started {
                self.lives[i].started = true;
                self.record
                    .coverage
                    .add("prefix hit", u64::from(row.extend_prefix_len > 0));
            }
        }
        let c = &mut self.record.coverage;
        let load_backs = plan.load_backs.len() as u64;
        if plan.forward.num_prefill_rows > 0 {
            c.add("host hit (load-back)", load_backs);
        }
        let recovery = plan
            .forward
            .rows
            .iter()
            .any(|row| row.kind == RowKind::Recovery);
        c.add("load-back on recovery", load_backs * u64::from(recovery));
        let finish = plan.write_backs.iter().filter(|op| !op.is_retract).count();
        c.add("finish write-back", finish as u64);
        c.add("L3 prefetch", plan.prefetches.len() as u64);
        for op in &plan.prefetches {
            self.prefetches.insert(op.op_id, op.dst_pages.len());
        }
        Ok(())
    }

    /// Holds back the acknowledgements the engine is late with, and hands over those
    /// due now (before this plan's events: they are older).
    fn hold_back(&mut self, events: Vec<EngineEvent>) -> Vec<EngineEvent> {
        if self.held.is_empty() && !self.late.fires() {
            return events;
        }
        let step = self.step;
        let mut now = Vec::with_capacity(events.len());
        let held = std::mem::take(&mut self.held);
        let (due, later): (Vec<_>, Vec<_>) = held.into_iter().partition(|(at, _)| *at <= step);
        self.held = later;
        now.extend(due.into_iter().map(|(_, event)| event));
        for event in events {
            match self.late.delay(&event) {
                Some(steps) => self.held.push((step + steps, event)),
                None => now.push(event),
            }
        }
        now
    }

    /// Takes a plan's events into the requests' lives.
    fn events(&mut self, events: &[EngineEvent]) -> Result<(), Stop> {
        for event in events {
            match event {
                EngineEvent::ExtendResult { request_id, tokens } => {
                    let i = self.request(request_id)?;
                    // Tokens for a request aborted before this advance are stale.
                    if self.lives[i].outcome == Outcome::Live {
                        self.lives[i].tokens.extend_from_slice(tokens);
                    }
                }
                EngineEvent::Finish { request_id } => {
                    let i = self.request(request_id)?;
                    if self.lives[i].outcome == Outcome::Live {
                        self.lives[i].outcome = Outcome::Finished;
                    }
                }
                EngineEvent::PrefetchDone {
                    op_id,
                    success,
                    completed_pages,
                    ..
                } => {
                    let asked = self.prefetches.remove(op_id).unwrap_or(0);
                    let partial = *success && (*completed_pages as usize) < asked;
                    self.record
                        .coverage
                        .add("L3 partial prefetch", u64::from(partial));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Makes the client aborts due at `moment`.
    fn aborts_at(&mut self, moment: Moment) -> Result<(), Stop> {
        let due: Vec<usize> = match &self.aborts {
            Aborts::Decide => self.decide_all(moment),
            Aborts::Replay(fired) => fired
                .iter()
                .filter(|f| f.step == self.step && f.moment == moment)
                .map(|f| f.request)
                .collect(),
            Aborts::Progress(at) => at
                .iter()
                .filter(|&(&i, &at)| {
                    let life = &self.lives[i];
                    life.outcome == Outcome::Live
                        && !life.abort_done
                        && match at {
                            AtProgress::Submit => moment == Moment::AfterSubmit,
                            AtProgress::FirstRow => {
                                moment == Moment::BeforeAdvance && self.rows.contains(&i)
                            }
                            AtProgress::Tokens(n) => {
                                moment == Moment::AfterAdvance && life.tokens.len() >= n
                            }
                        }
                })
                .map(|(&i, _)| i)
                .collect(),
        };
        for i in due {
            self.abort(i, moment)?;
        }
        Ok(())
    }

    /// The requests the direct run aborts now: by their own drawn points, then the first
    /// request in each drawn state.
    fn decide_all(&mut self, moment: Moment) -> Vec<usize> {
        let mut due: Vec<usize> = (0..self.lives.len())
            .filter(|&i| self.decide(i, moment))
            .collect();
        for (k, abort) in self.spec.first_in_state.iter().enumerate() {
            let when = if abort.before_advance {
                Moment::BeforeAdvance
            } else {
                Moment::AfterAdvance
            };
            if self.state_aborts_fired[k] || moment != when {
                continue;
            }
            let first = (0..self.lives.len()).find(|&i| {
                let life = &self.lives[i];
                !life.abort_done
                    && !due.contains(&i)
                    && matches!(life.outcome, Outcome::Live | Outcome::Finished)
                    && self.sut.state(&self.ids[i]) == Some(abort.state)
            });
            if let Some(i) = first {
                self.state_aborts_fired[k] = true;
                due.push(i);
            }
        }
        due
    }

    /// Whether the direct run aborts request `i` now, by its drawn point.
    fn decide(&self, i: usize, moment: Moment) -> bool {
        let (life, r) = (&self.lives[i], &self.spec.requests[i]);
        let Some(abort) = r.abort else { return false };
        if life.abort_done {
            return false;
        }
        let live = life.outcome == Outcome::Live;
        match abort.at {
            AbortPoint::Submitted => live && moment == Moment::AfterSubmit,
            AbortPoint::Generated(n) => {
                live && moment == Moment::AfterAdvance && life.tokens.len() >= n as usize
            }
            AbortPoint::InState(state) => {
                let when = if abort.before_advance {
                    Moment::BeforeAdvance
                } else {
                    Moment::AfterAdvance
                };
                // A finished request the scheduler still knows (draining or writing
                // back) may be aborted too.
                (live || life.outcome == Outcome::Finished)
                    && moment == when
                    && self.sut.state(&self.ids[i]) == Some(state)
            }
        }
    }

    fn abort(&mut self, i: usize, moment: Moment) -> Result<(), Stop> {
        let id = RequestId::from(self.spec.requests[i].name.as_str());
        let state = self.sut.state(&id);
        self.sut
            .abort(id.clone())
            .map_err(|e| self.system(&format!("abort {id}"), e))?;
        self.checked("abort")?;
        let life = &mut self.lives[i];
        life.abort_done = true;
        if life.outcome == Outcome::Live {
            life.outcome = Outcome::ClientAborted;
        }
        if let Some(state) = state {
            self.record.coverage.add(&coverage::client_abort(state), 1);
        }
        self.record.fired.push(Fired {
            step: self.step,
            moment,
            request: i,
            tokens: self.lives[i].tokens.len(),
        });
        Ok(())
    }
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
