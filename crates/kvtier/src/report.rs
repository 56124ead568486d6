//! What the system reports: counters of every actor, and what shutdown found.

use kvtier_device::DeviceStats;
use kvtier_fsm::{SchedulerCore, SchedulerStats};
use kvtier_host::HostStats;
use kvtier_l3::L3TierStats;
use kvtier_types::RequestId;

use crate::KvError;

/// Counters and gauges of the whole system.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SystemStats {
    /// The scheduler's counters with the cache's gauges.
    pub scheduler: SchedulerStats,
    /// The host allocator's counters.
    pub host: HostStats,
    /// The device's counters, when the system has a device.
    pub device: Option<DeviceStats>,
    /// The L3 actor's counters, when the system has one.
    pub l3: Option<L3TierStats>,
}

/// What shutdown found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Requests still live (not finished or aborted) when the system stopped.
    pub live_requests: Vec<RequestId>,
    /// Write-backs and backups issued and not acknowledged.
    pub ops_in_flight: usize,
    /// Pages held outside the tree by live requests (device, host).
    pub held_pages: [usize; 2],
    /// Page conservation after the scheduler let go of everything: `Err` names a page
    /// that was neither free nor in the tree (a leak, as `KvError::Cache`), or the fault
    /// that kept the check from running.
    pub conservation: Result<(), KvError>,
    /// The host allocator once the cache returned its lease: every page free.
    pub host: HostStats,
    /// The fault that had failed the system, or that shutdown met, if any.
    pub failure: Option<KvError>,
}

impl Default for ShutdownReport {
    fn default() -> Self {
        Self {
            live_requests: Vec::new(),
            ops_in_flight: 0,
            held_pages: [0, 0],
            conservation: Ok(()),
            host: HostStats::default(),
            failure: None,
        }
    }
}

impl ShutdownReport {
    /// What the scheduler core still holds, before it is dropped.
    pub(crate) fn of_core(core: &SchedulerCore) -> Self {
        let [device, host] = core.outside_pages();
        Self {
            live_requests: core.request_ids(),
            ops_in_flight: core.ops_in_flight(),
            held_pages: [device.len(), host.len()],
            ..Self::default()
        }
    }

    /// Whether nothing was held or leaked.
    pub fn is_clean(&self) -> bool {
        self.live_requests.is_empty()
            && self.ops_in_flight == 0
            && self.held_pages == [0, 0]
            && self.conservation.is_ok()
            && self.host.leased_pages == 0
    }
}
