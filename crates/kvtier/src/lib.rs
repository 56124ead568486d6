//! kvtier's embedding API: the actor system over the scheduler, radix and host cores.
//!
//! [`System::builder`] wires one actor per core — the Scheduler (request FSM), the Radix
//! cache and the Host allocator, and optionally the Device and the L3 store — under one
//! of two runtimes, and returns a [`Handle`]
//! (`Clone + Send + Sync`) with async `submit`, `next_plan`, `advance`, `abort`, `stats`
//! and `shutdown`. [`BlockingHandle`] wraps it for callers outside async code, and
//! [`SystemBuilder::start_local`] runs the same actors on the caller's own thread.
//!
//! * [`Runtime::Actix`] (default): actix 0.13 actors, one generic shell per core.
//! * [`Runtime::Deterministic`]: a single-threaded bus delivers the same messages in a
//!   fixed order; [`FaultHooks`] may delay, reorder or fail deliveries.
//! * [`Runtime::Direct`]: the cores called in place, in sending order.
//!
//! All give the same plans as [`kvtier_fsm::Scheduler`], step for step: the cores are
//! the same, and each call is one conversation (`conversation/`, written once) of the
//! typed messages each core declares beside itself (`docs/messages.md`). An embedder's
//! own actor joins with [`SystemBuilder::actor`] and is reached with [`Handle::ask`].
//!
//! ```
//! use kvtier::{BlockingHandle, System};
//! use kvtier_types::{EngineEvent, RequestSpec, SchedulerConfig};
//!
//! let config = SchedulerConfig { page_size: 2, device_pages: 32, host_pages: 32, ..Default::default() };
//! let handle = BlockingHandle::new(System::builder(config).start()?);
//! handle.submit(vec![RequestSpec::new("r1", vec![11, 12, 13, 14, 15])])?;
//! let plan = handle.next_plan()?;
//! assert_eq!(plan.forward.rows.len(), 1);
//! handle.advance(vec![EngineEvent::Finish { request_id: "r1".into() }])?;
//! let report = handle.shutdown()?;
//! assert!(report.conservation.is_ok() && report.host.leased_pages == 0);
//! # Ok::<(), kvtier::KvError>(())
//! ```

mod conversation;
mod error;
mod faults;
mod handle;
pub mod kv_publisher;
mod local;
mod mail;
pub mod metrics;
mod outcome;
mod report;
mod runtime;
mod service;
pub mod telemetry;
pub mod vllm_events;

use std::collections::BTreeSet;

use kvtier_device::DeviceCore;
use kvtier_fsm::{SchedulerCore, cache_config};
use kvtier_host::HostCore;
use kvtier_l3::L3Core;
use kvtier_radix::RadixCore;

pub use error::{KvError, SetupError};
pub use faults::{Delivery, Fault, FaultHooks, NoFaults};
pub use handle::{BlockingHandle, Handle, block_on};
/// The direct path (the scheduler over a cache it owns, no actors) and its counters.
pub use kvtier_fsm::{SchedError, Scheduler, SchedulerStats};
/// A cache family of one's own ([`SystemBuilder::cache_family`]).
pub use kvtier_radix::{CacheFamily, TreeEvent};
/// The vocabulary an engine speaks with the scheduler, so that an embedder depends on
/// `kvtier` alone: the config, requests, plans and the events that answer them.
pub use kvtier_types::{
    AbortNotice, AbortReason, BackupOp, EngineEvent, ExecutionPlan, ForwardBatch, ForwardRow,
    GroupTable, LoadBackOp, MambaRow, MambaSettings, OpId, PageId, PagedSettings, Policy,
    PrefetchOp, RequestId, RequestSpec, RowKind, SchedulerConfig, SlotId, Tier, Token,
    TransferKind, TransferPair, WriteBackOp,
};
pub use kvtier_types::{ActorCore, ActorName, Placement};
pub use local::LocalSystem;
pub use report::{ShutdownReport, SystemStats};
pub use service::{L3Service, Service};

use conversation::Front;
use faults::Post;
use mail::{Destination, Destinations, Slot};
use runtime::Driver;

/// Which runtime delivers the messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Runtime {
    /// actix actors (on a dedicated thread under `start`).
    #[default]
    Actix,
    /// The single-threaded deterministic bus.
    Deterministic,
    /// The cores called in place, in sending order.
    Direct,
}

/// Entry point of the embedding API.
#[derive(Debug)]
pub struct System;

impl System {
    /// A builder over a scheduler configuration.
    pub fn builder(config: SchedulerConfig) -> SystemBuilder {
        SystemBuilder {
            config,
            runtime: Runtime::default(),
            hooks: None,
            actors: Vec::new(),
            l3: None,
            family: None,
        }
    }
}

/// Configures and starts a [`System`].
#[derive(Debug)]
pub struct SystemBuilder {
    config: SchedulerConfig,
    runtime: Runtime,
    hooks: Option<Box<dyn FaultHooks>>,
    /// The actors beyond the scheduler, radix cache and host allocator.
    actors: Vec<Box<dyn Destination>>,
    /// The L3 core's page size and host arena pages, checked against the config.
    l3: Option<(u32, u32)>,
    /// A cache family its user registered, hosted by the radix cache.
    family: Option<Box<dyn CacheFamily>>,
}

impl SystemBuilder {
    /// Adds the device actor over this core (arenas, kernel backend, model runner).
    pub fn device(self, device: DeviceCore) -> Self {
        self.actor(device)
    }

    /// Adds the L3 store actor over this core (backend, key namespace, the host arena it
    /// shares with the device). Needs `enable_l3_storage` and the core's page size.
    /// Submits then look their prompts up in the store, and `execute` runs each plan's
    /// prefetches and backups on it. Its backend's calls never run on the scheduler's
    /// thread under actix.
    pub fn l3(mut self, l3: L3Core) -> Self {
        self.l3 = Some((l3.page_size(), l3.arena().pages()));
        self.actor(l3)
    }

    /// Adds an actor over any core: it is reached with [`Handle::ask`], stopped at
    /// shutdown, and placed as its [`ActorCore::PLACEMENT`] says.
    pub fn actor<C: ActorCore + std::fmt::Debug>(mut self, core: C) -> Self {
        self.actors.push(Slot::boxed(core));
        self
    }

    /// Hosts `family` on the radix cache beside the KV of a full-attention model: the
    /// cache caps matches by it, gives each request its part and tells it of every change
    /// to the tree ([`CacheFamily`]). A config with a Mamba or paged family refuses it.
    pub fn cache_family(mut self, family: Box<dyn CacheFamily>) -> Self {
        self.family = Some(family);
        self
    }

    /// Chooses the runtime.
    pub fn runtime(mut self, runtime: Runtime) -> Self {
        self.runtime = runtime;
        self
    }

    /// Fault hooks: every delivery passes them, on every runtime.
    pub fn fault_hooks(mut self, hooks: impl FaultHooks + 'static) -> Self {
        self.hooks = Some(Box::new(hooks));
        self
    }

    /// Builds the cores and starts the actors on the calling thread: they run while a
    /// call of the returned [`LocalSystem`] waits. Fails on an invalid config.
    pub fn start_local(self) -> Result<LocalSystem, KvError> {
        let runtime = self.runtime;
        let (front, actors, post) = self.build()?;
        let driver: Box<dyn Driver> = match runtime {
            Runtime::Actix => Box::new(runtime::actix::ActixLocal::new(front, actors, post)),
            Runtime::Deterministic => Box::new(runtime::bus::Bus::new(front, actors, post)),
            Runtime::Direct => Box::new(runtime::direct::Direct::new(front, actors, post)),
        };
        Ok(LocalSystem::new(driver))
    }

    /// Builds the cores and starts the actors on a thread of their own. Fails on an
    /// invalid config.
    pub fn start(self) -> Result<Handle, KvError> {
        let runtime = self.runtime;
        let (front, actors, post) = self.build()?;
        match runtime {
            Runtime::Actix => {
                Handle::actix(move || runtime::actix::start(front, actors, post, true))
            }
            Runtime::Deterministic => {
                Handle::driver(Box::new(runtime::bus::Bus::new(front, actors, post)))
            }
            Runtime::Direct => {
                Handle::driver(Box::new(runtime::direct::Direct::new(front, actors, post)))
            }
        }
    }

    /// The cores, wired: the radix cache's host tier is a lease from the host
    /// allocator.
    fn build(self) -> Result<(Front, Destinations, Post), KvError> {
        let core = SchedulerCore::new(self.config)?;
        let c = core.config();
        if let Some((l3_page_size, arena_pages)) = self.l3 {
            if !c.enable_l3_storage {
                return Err(SetupError::L3StorageDisabled.into());
            }
            if l3_page_size != c.page_size || arena_pages < c.host_pages {
                return Err(SetupError::L3Geometry {
                    l3_page_size,
                    arena_pages,
                    page_size: c.page_size,
                    host_pages: c.host_pages,
                }
                .into());
            }
        }
        let cache_config = cache_config(c);
        let mut host = HostCore::new(cache_config.host_pages);
        let lease = host
            .lease(cache_config.host_pages.saturating_sub(1))
            .map_err(SetupError::HostLease)?;
        let mut cache =
            RadixCore::with_host_lease(&cache_config, lease).map_err(SetupError::Cache)?;
        if let Some(family) = self.family {
            cache = cache.hosting(family).map_err(SetupError::Cache)?;
        }
        let mut actors = Destinations::new();
        let builtin: [Box<dyn Destination>; 2] = [Slot::boxed(cache), Slot::boxed(host)];
        for actor in builtin.into_iter().chain(self.actors) {
            let name = actor.name();
            if name == ActorName::SCHEDULER || actors.contains_key(&name) {
                return Err(SetupError::DuplicateActor(name).into());
            }
            actors.insert(name, actor);
        }
        let names: BTreeSet<ActorName> = actors.keys().copied().collect();
        let hooks = self.hooks.unwrap_or_else(|| Box::new(NoFaults));
        Ok((Front::new(core, names), actors, Post::new(hooks)))
    }
}
