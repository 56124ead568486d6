//! The typed messages between the actors (`docs/messages.md` is the catalogue).
//!
//! One message per actor per call: a scheduling step sends one [`RunBatch`] to the radix
//! actor (two when it must retract), an `advance` at most one.

use kvtier_device::{DeviceCore, DeviceStats, NewRequest};
use kvtier_fsm::SchedulerStats;
use kvtier_host::{HostError, HostStats, OwnedPages};
use kvtier_l3::L3TierStats;
use kvtier_radix::{CacheBatch, CacheReply, TreeStats};
use kvtier_types::{
    BackupOp, EngineEvent, ExecutionPlan, KvEvent, PageId, PrefetchOp, RequestId, RequestSpec,
};

use crate::KvError;

/// What a message answers.
pub trait Request {
    /// The reply type.
    type Reply: Send + 'static;
}

macro_rules! request {
    ($($msg:ty => $reply:ty;)*) => {$(
        impl Request for $msg {
            type Reply = $reply;
        }
        impl actix::Message for $msg {
            type Result = $reply;
        }
    )*};
}

// ----- to the Scheduler actor (from the handle) -----------------------------------

/// Queue requests.
#[derive(Debug)]
pub struct Submit {
    /// The requests.
    pub specs: Vec<RequestSpec>,
    /// The caller's span.
    pub span: tracing::Span,
}

/// Apply engine events in order.
#[derive(Debug)]
pub struct Advance {
    /// The events.
    pub events: Vec<EngineEvent>,
    /// The caller's span.
    pub span: tracing::Span,
}

/// Abort one request.
#[derive(Debug)]
pub struct Abort {
    /// The request.
    pub id: RequestId,
    /// The caller's span.
    pub span: tracing::Span,
}

/// Build the next execution plan.
#[derive(Debug)]
pub struct NextPlan {
    /// The caller's span.
    pub span: tracing::Span,
}

/// Counters and gauges of every actor.
#[derive(Debug)]
pub struct Stats;

/// Take the KV-cache events collected since the last call.
#[derive(Debug)]
pub struct TakeKvEvents;

/// Drain what is in flight, drop every core and report what was still held.
#[derive(Debug)]
pub struct Shutdown;

// ----- to the Radix actor (from the scheduler) -------------------------------------

/// Execute one batch of cache ops in order.
#[derive(Debug)]
pub struct RunBatch {
    /// The ops.
    pub batch: CacheBatch,
    /// The scheduler's span, entered while the batch runs.
    pub span: tracing::Span,
}

/// The tree's counters.
#[derive(Debug)]
pub struct CacheStats;

/// The KV-cache events collected since the last call.
#[derive(Debug)]
pub struct DrainKvEvents;

/// Check the tree's invariants with the pages held outside it.
#[derive(Debug)]
pub struct CheckPages {
    /// Pages held outside the tree, per tier.
    pub outside: [Vec<PageId>; 2],
}

/// Drop the cache (its host lease goes back to the host allocator).
#[derive(Debug)]
pub struct CloseCache;

// ----- to the Device actor (from the engine) ---------------------------------------

/// Execute a plan's write-backs and load-backs on the arenas, then its forward rows
/// through the model runner; the reply is the events for `advance`.
#[derive(Debug)]
pub struct Execute {
    /// The plan.
    pub plan: ExecutionPlan,
    /// Requests submitted since the last plan, for the model runner.
    pub new_requests: Vec<NewRequest>,
    /// The caller's span.
    pub span: tracing::Span,
}

/// Take the device core out (at the end of a run, to read its runner).
#[derive(Debug)]
pub struct TakeDevice;

/// The device's counters.
#[derive(Debug)]
pub struct DeviceStatsQuery;

// ----- to the L3 store actor -------------------------------------------------------

/// Look each prompt up in the store: the reply is the same specs with
/// `storage_hit_pages` set (consecutive stored pages from the first).
#[derive(Debug)]
pub struct L3Lookup {
    /// The requests being submitted.
    pub specs: Vec<RequestSpec>,
    /// Prompts with no more than this many full pages are not looked up.
    pub threshold: u32,
    /// The caller's span.
    pub span: tracing::Span,
}

/// Run a plan's prefetches and backups; the reply is their `PrefetchDone` and
/// `BackupDone` events.
#[derive(Debug)]
pub struct L3Transfer {
    /// L3 → host fills.
    pub prefetches: Vec<PrefetchOp>,
    /// Host → L3 copies.
    pub backups: Vec<BackupOp>,
    /// The caller's span.
    pub span: tracing::Span,
}

/// The L3 actor's counters.
#[derive(Debug)]
pub struct L3StatsQuery;

// ----- to the Host allocator actor -------------------------------------------------

/// Lease host pages.
#[derive(Debug)]
pub struct Lease {
    /// Pages wanted.
    pub pages: u32,
}

/// The host allocator's counters.
#[derive(Debug)]
pub struct HostStatsQuery;

request! {
    Submit => Result<(), KvError>;
    Advance => Result<(), KvError>;
    Abort => Result<(), KvError>;
    NextPlan => Result<ExecutionPlan, KvError>;
    Stats => Result<SystemStats, KvError>;
    TakeKvEvents => Result<Vec<KvEvent>, KvError>;
    Shutdown => ShutdownReport;
    RunBatch => CacheReply;
    CacheStats => TreeStats;
    DrainKvEvents => Vec<KvEvent>;
    CheckPages => Result<(), String>;
    CloseCache => ();
    Lease => Result<OwnedPages, HostError>;
    Execute => Result<Vec<EngineEvent>, KvError>;
    TakeDevice => Option<DeviceCore>;
    DeviceStatsQuery => Option<DeviceStats>;
    HostStatsQuery => HostStats;
    L3Lookup => Vec<RequestSpec>;
    L3Transfer => Vec<EngineEvent>;
    L3StatsQuery => L3TierStats;
}

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
    /// that was neither free nor in the tree (a leak).
    pub conservation: Result<(), String>,
    /// The host allocator once the cache returned its lease: every page free.
    pub host: HostStats,
    /// The call that had failed the system, if any.
    pub failure: Option<String>,
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
    /// Whether nothing was held or leaked.
    pub fn is_clean(&self) -> bool {
        self.live_requests.is_empty()
            && self.ops_in_flight == 0
            && self.held_pages == [0, 0]
            && self.conservation.is_ok()
            && self.host.leased_pages == 0
    }
}

/// Helpers for the shells: what the scheduler core reports before it is dropped.
pub(crate) fn core_report(core: &kvtier_fsm::SchedulerCore) -> ShutdownReport {
    let [device, host] = core.outside_pages();
    ShutdownReport {
        live_requests: core.request_ids(),
        ops_in_flight: core.ops_in_flight(),
        held_pages: [device.len(), host.len()],
        ..ShutdownReport::default()
    }
}
