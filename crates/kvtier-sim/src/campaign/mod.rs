//! The seeded campaign (issue 17, item 4): random but reproducible workloads through the
//! whole system with the integrity oracle, each run with the cache on and off.
//!
//! A seed draws a [`RunSpec`] ([`RunSpec::draw`]): page size (1 to 64), pools from
//! tight to roomy, L2 and L3 on or off, requests with shared prefixes and follow-up
//! turns arriving over the steps, client aborts at every state, and fault rates for
//! every hook (write-back and load-back copies, late acknowledgements, L3 gets, lost
//! objects and lookups, bus delays and reorderings). [`run_spec`] runs it three times — on the direct path with the
//! scheduler's invariants after every call, through the actors on the deterministic
//! runtime with the cache on (plans equal to the direct path's), and with the cache off
//! — and checks that the oracle found nothing, the answers agree, and nothing leaked
//! (`run.rs` says how). A failing seed is shrunk ([`shrink`]) to the smallest spec that
//! still fails the same check; its `Debug` is the reproduction.
//!
//! Everything is deterministic: the spec and every fault decision come from the seed,
//! and every decision iterates ordered structures. See docs/campaign.md.

mod coverage;
mod faults;
mod run;
mod shrink;
mod spec;

use std::fmt;
use std::panic::AssertUnwindSafe;

use serde::Serialize;

pub use coverage::{Coverage, CoverageRow, metric_names, table};
pub use faults::{
    BusChaos, CampaignCopyFaults, CampaignL3Faults, FaultKind, FaultRates, FaultTally, LateAcks,
};
pub use shrink::shrink;
pub use spec::{AbortPoint, Base, ClientAbort, L3Spec, Prefix, RequestDraw, RunSpec, StateAbort};

use crate::scenario::ScenarioError;
use crate::tokens::splitmix64;

/// Runs of a failing spec the shrinker may spend by default.
pub const SHRINK_BUDGET: usize = 200;

/// Why the campaign could not run a spec at all (never a finding about the system).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CampaignError {
    /// A hand-written spec is inconsistent.
    #[error("invalid run spec: {0}")]
    Spec(String),
    /// A run's device, store or directory could not be set up.
    #[error("run setup: {0}")]
    Setup(String),
    /// The shared scenario machinery refused (arenas, the L3 store, a directory).
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
}

impl From<kvtier_device::DeviceError> for CampaignError {
    fn from(e: kvtier_device::DeviceError) -> Self {
        CampaignError::Setup(e.to_string())
    }
}

/// What a failing seed broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Check {
    /// A call of the system failed (`KvError`).
    System,
    /// The run panicked.
    Panic,
    /// No quiescence within the step limit.
    Stalled,
    /// The engine protocol: a row or abort notice for a request that is not live, a
    /// request the scheduler forgot, a refusal of a valid prompt.
    Protocol,
    /// `check_invariants` failed on the direct path.
    Invariant,
    /// The actors' plans, KV events or answers differ from the direct path's.
    PathDivergence,
    /// The oracle found wrong KV.
    Integrity,
    /// The cache-on and cache-off answers differ.
    Answers,
    /// Something was held or leaked at the end.
    Leak,
}

/// Which of a seed's three runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RunKind {
    /// Cache on, on the direct path (`kvtier_fsm::Scheduler`).
    Direct,
    /// Cache on, through the actors on the deterministic runtime.
    CacheOn,
    /// Cache off, through the actors on the deterministic runtime.
    CacheOff,
}

/// A check that failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Failure {
    /// Which check.
    pub check: Check,
    /// In which run.
    pub run: RunKind,
    /// At which step, when it failed during the run.
    pub step: Option<u64>,
    /// What it found.
    pub detail: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} in the {:?} run", self.check, self.run)?;
        if let Some(step) = self.step {
            write!(f, " at step {step}")?;
        }
        write!(f, ": {}", self.detail)
    }
}

/// What one spec's runs found.
#[derive(Debug, Clone)]
pub struct SeedReport {
    /// The spec's seed.
    pub seed: u64,
    /// What the runs reached (empty when a check failed).
    pub coverage: Coverage,
    /// The first check that failed, if any.
    pub failure: Option<Failure>,
}

/// Runs `spec` with every check; a panic of the system is a failure like any other.
pub fn run_spec(spec: &RunSpec) -> Result<SeedReport, CampaignError> {
    // Each run builds its own system, so nothing a panic interrupted is seen again.
    match std::panic::catch_unwind(AssertUnwindSafe(|| run::run_spec(spec))) {
        Ok(result) => result,
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            Ok(SeedReport {
                seed: spec.seed,
                coverage: Coverage::default(),
                failure: Some(Failure {
                    check: Check::Panic,
                    run: RunKind::Direct,
                    step: None,
                    detail: message,
                }),
            })
        }
    }
}

/// Draws seed `seed`'s spec and runs it.
pub fn run_seed(seed: u64) -> Result<SeedReport, CampaignError> {
    run_spec(&RunSpec::draw(seed))
}

/// A failing seed and its shrunk reproduction.
#[derive(Debug, Clone, Serialize)]
pub struct SeedFailure {
    /// The seed.
    pub seed: u64,
    /// What its drawn spec broke.
    pub failure: Failure,
    /// The smallest spec found that breaks the same check (`{:#?}`).
    pub shrunk_spec: String,
    /// What the shrunk spec broke.
    pub shrunk_failure: Failure,
    /// Runs the shrinker spent.
    pub shrink_runs: usize,
}

/// A seed the campaign could not run.
#[derive(Debug, Clone, Serialize)]
pub struct SeedError {
    /// The seed.
    pub seed: u64,
    /// Why.
    pub error: String,
}

/// Which seeds a campaign runs, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CampaignOptions {
    /// The first seed.
    pub from: u64,
    /// How many seeds, from `from` on.
    pub seeds: u64,
    /// Seeds run at once, each on its own thread (results do not depend on it).
    pub jobs: usize,
    /// Runs the shrinker may spend on each failing seed (0: no shrinking).
    pub shrink_budget: usize,
}

/// What a campaign found, in seed order.
#[derive(Debug, Clone, Serialize)]
pub struct CampaignReport {
    /// The first seed.
    pub from: u64,
    /// Seeds run.
    pub seeds: u64,
    /// Seeds whose runs passed every check.
    pub passed: u64,
    /// Seeds that failed a check.
    pub failures: Vec<SeedFailure>,
    /// Seeds that could not be run.
    pub errors: Vec<SeedError>,
    /// What the passing runs reached.
    pub coverage: Vec<CoverageRow>,
}

enum SeedOutcome {
    Passed(Coverage),
    Failed(Box<SeedFailure>),
    Error(String),
}

fn run_one(seed: u64, shrink_budget: usize) -> SeedOutcome {
    let spec = RunSpec::draw(seed);
    match run_spec(&spec) {
        Err(e) => SeedOutcome::Error(e.to_string()),
        Ok(SeedReport {
            failure: None,
            coverage,
            ..
        }) => SeedOutcome::Passed(coverage),
        Ok(SeedReport {
            failure: Some(failure),
            ..
        }) => {
            let (shrunk, shrunk_failure, shrink_runs) = shrink(&spec, &failure, shrink_budget);
            SeedOutcome::Failed(Box::new(SeedFailure {
                seed,
                failure,
                shrunk_spec: format!("{shrunk:#?}"),
                shrunk_failure,
                shrink_runs,
            }))
        }
    }
}

/// Runs the seeds `from..from + seeds` on `jobs` threads, shrinking each failure;
/// `progress(done, failed)` is called on this thread after each seed.
pub fn run_campaign(
    options: &CampaignOptions,
    mut progress: impl FnMut(u64, u64),
) -> CampaignReport {
    let CampaignOptions {
        from,
        seeds,
        jobs,
        shrink_budget,
    } = *options;
    let next = std::sync::atomic::AtomicU64::new(0);
    let mut outcomes: Vec<(u64, SeedOutcome)> = Vec::new();
    let mut failed = 0;
    let mut take = |seed: u64, outcome: SeedOutcome, outcomes: &mut Vec<(u64, SeedOutcome)>| {
        failed += u64::from(!matches!(outcome, SeedOutcome::Passed(_)));
        outcomes.push((seed, outcome));
        progress(outcomes.len() as u64, failed);
    };
    let work = |next: &std::sync::atomic::AtomicU64| {
        let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        (k < seeds).then(|| from.wrapping_add(k))
    };
    if jobs <= 1 {
        while let Some(seed) = work(&next) {
            let outcome = run_one(seed, shrink_budget);
            take(seed, outcome, &mut outcomes);
        }
    } else {
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::channel();
            for _ in 0..jobs {
                let (tx, next) = (tx.clone(), &next);
                scope.spawn(move || {
                    while let Some(seed) = work(next) {
                        if tx.send((seed, run_one(seed, shrink_budget))).is_err() {
                            return;
                        }
                    }
                });
            }
            drop(tx);
            for (seed, outcome) in rx {
                take(seed, outcome, &mut outcomes);
            }
        });
    }
    outcomes.sort_by_key(|(seed, _)| *seed);
    let mut report = CampaignReport {
        from,
        seeds,
        passed: 0,
        failures: Vec::new(),
        errors: Vec::new(),
        coverage: Vec::new(),
    };
    let mut passed = Vec::new();
    for (seed, outcome) in outcomes {
        match outcome {
            SeedOutcome::Passed(coverage) => passed.push(coverage),
            SeedOutcome::Failed(failure) => report.failures.push(*failure),
            SeedOutcome::Error(error) => report.errors.push(SeedError { seed, error }),
        }
    }
    report.passed = passed.len() as u64;
    report.coverage = coverage::table(&passed);
    report
}

/// A splitmix64 stream: the campaign's only source of randomness.
#[derive(Debug, Clone)]
pub(crate) struct SeedRng(u64);

impl SeedRng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        let out = splitmix64(self.0);
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        out
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// True with probability `per_mille` / 1000.
    pub(crate) fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }

    /// A token stream name (tags hold 48 bits of index).
    pub(crate) fn stream(&mut self) -> u64 {
        self.next_u64() & ((1 << 48) - 1)
    }

    /// One of `choices` with probability proportional to its weight (`None` when no
    /// choice has any).
    pub(crate) fn weighted<T: Copy>(&mut self, choices: &[(T, u64)]) -> Option<T> {
        let total: u64 = choices.iter().map(|(_, w)| w).sum();
        let mut pick = self.below(total);
        for &(choice, weight) in choices {
            if pick < weight {
                return Some(choice);
            }
            pick -= weight;
        }
        None
    }
}
