//! The seeded campaign (issue 17, item 4): random but reproducible workloads through the
//! whole system with the integrity oracle, each run with the cache on and off.
//!
//! A seed draws a [`RunSpec`] ([`RunSpec::draw`]): page size (1 to 64), pools from
//! tight to roomy, L2 and L3 on or off, requests with shared prefixes and follow-up
//! turns arriving over the steps, client aborts at every state, and fault rates for
//! every hook (write-back copies, L3 gets, lost objects and lookups, bus delays and
//! reorderings).
//!
//! Everything is deterministic: the spec and every fault decision come from the seed.

mod coverage;
mod faults;
mod spec;

pub use coverage::{Coverage, CoverageRow, metric_names, table};
pub use faults::{
    BusChaos, CampaignCopyFaults, CampaignL3Faults, FaultKind, FaultRates, FaultTally,
};
pub use spec::{AbortPoint, Base, ClientAbort, L3Spec, Prefix, RequestDraw, RunSpec, StateAbort};

use crate::scenario::ScenarioError;
use crate::tokens::splitmix64;

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
