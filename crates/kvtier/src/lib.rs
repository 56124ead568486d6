//! kvtier's embedding API: the actor system over the scheduler, radix and host cores.
//!
//! [`System::builder`] wires one actor per core — the Scheduler (request FSM), the Radix
//! cache and the Host allocator, and optionally the Device and the L3 store — under one
//! of two runtimes, and returns a [`Handle`]
//! (`Clone + Send + Sync`) with async `submit`, `next_plan`, `advance`, `abort`, `stats`
//! and `shutdown`. [`BlockingHandle`] wraps it for callers outside async code, and
//! [`SystemBuilder::start_local`] runs the same actors on the caller's own thread.
//!
//! * [`Runtime::Actix`] (default): actix 0.13 actors on their own thread; the three
//!   actors share one arbiter, so their messages never hop threads.
//! * [`Runtime::Deterministic`]: a single-threaded bus delivers the same messages in a
//!   fixed order, with [`FaultHooks`] to delay, fail or reorder deliveries.
//!
//! Both give the same plans as the direct path, [`kvtier_fsm::Scheduler`], step for step:
//! the cores are the same and each call is one conversation of typed messages
//! (`docs/messages.md`).
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

mod error;
mod handle;
mod l3;
mod local;
pub mod messages;
pub mod runtime;

use kvtier_device::DeviceCore;
use kvtier_fsm::{SchedulerCore, cache_config};
use kvtier_host::HostAllocator;
use kvtier_l3::L3Core;
use kvtier_radix::RadixCache;
use kvtier_types::SchedulerConfig;

pub use error::KvError;
pub use handle::{BlockingHandle, Handle, block_on};
pub use l3::L3Service;
pub use local::LocalSystem;
pub use messages::{ShutdownReport, SystemStats};
pub use runtime::deterministic::{ActorName, Delivery, Fault, FaultHooks, NoFaults};

/// Which runtime delivers the messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Runtime {
    /// actix actors on a dedicated thread.
    #[default]
    Actix,
    /// The single-threaded deterministic bus.
    Deterministic,
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
            device: None,
            l3: None,
        }
    }
}

/// Configures and starts a [`System`].
#[derive(Debug)]
pub struct SystemBuilder {
    config: SchedulerConfig,
    runtime: Runtime,
    hooks: Option<Box<dyn FaultHooks>>,
    device: Option<DeviceCore>,
    l3: Option<L3Core>,
}

impl SystemBuilder {
    /// Adds the L3 store actor over this core (backend, key namespace, the host arena it
    /// shares with the device). Needs `enable_l3_storage` and the core's page size.
    /// Submits then look their prompts up in the store, and `execute` runs each plan's
    /// prefetches and backups on it. Its backend's calls never run on the scheduler's
    /// thread under actix.
    pub fn l3(mut self, l3: L3Core) -> Self {
        self.l3 = Some(l3);
        self
    }

    /// Adds the device actor over this core (arenas, kernel backend, model runner).
    pub fn device(mut self, device: DeviceCore) -> Self {
        self.device = Some(device);
        self
    }

    /// Chooses the runtime.
    pub fn runtime(mut self, runtime: Runtime) -> Self {
        self.runtime = runtime;
        self
    }

    /// Fault hooks for the deterministic runtime (implies it).
    pub fn fault_hooks(mut self, hooks: impl FaultHooks + 'static) -> Self {
        self.runtime = Runtime::Deterministic;
        self.hooks = Some(Box::new(hooks));
        self
    }

    /// Builds the cores and starts the actors on the calling thread: they run while a
    /// call of the returned [`LocalSystem`] waits. Fails on an invalid config.
    pub fn start_local(self) -> Result<LocalSystem, KvError> {
        let parts = Parts::build(self.config, self.device, self.l3)?;
        Ok(match self.runtime {
            Runtime::Actix => LocalSystem::actix(parts),
            Runtime::Deterministic => LocalSystem::bus(runtime::deterministic::Bus::new(
                parts,
                self.hooks.unwrap_or_else(|| Box::new(NoFaults)),
            )),
        })
    }

    /// Builds the cores and starts the actors. Fails on an invalid config.
    pub fn start(self) -> Result<Handle, KvError> {
        let parts = Parts::build(self.config, self.device, self.l3)?;
        match self.runtime {
            Runtime::Actix => Handle::start_actix(parts),
            Runtime::Deterministic => {
                Handle::start_bus(parts, self.hooks.unwrap_or_else(|| Box::new(NoFaults)))
            }
        }
    }
}

/// The cores of one system, wired: the radix cache's host tier is a lease from the
/// host allocator.
#[derive(Debug)]
pub(crate) struct Parts {
    pub core: SchedulerCore,
    pub cache: RadixCache,
    pub host: HostAllocator,
    pub device: Option<DeviceCore>,
    pub l3: Option<L3Core>,
}

impl Parts {
    fn build(
        config: SchedulerConfig,
        device: Option<DeviceCore>,
        l3: Option<L3Core>,
    ) -> Result<Self, KvError> {
        let core = SchedulerCore::new(config)?;
        if let Some(l3) = &l3 {
            let c = core.config();
            if !c.enable_l3_storage {
                return Err(KvError::Setup(
                    "an L3 actor needs enable_l3_storage in the scheduler config".into(),
                ));
            }
            if l3.page_size() != c.page_size || l3.arena().pages() < c.host_pages {
                return Err(KvError::Setup(format!(
                    "the L3 actor moves pages of {} tokens in a host arena of {} pages; \
                     the scheduler has pages of {} tokens and {} host pages",
                    l3.page_size(),
                    l3.arena().pages(),
                    c.page_size,
                    c.host_pages
                )));
            }
        }
        let cache_config = cache_config(core.config());
        let mut host = HostAllocator::new(cache_config.host_pages);
        let usable = cache_config.host_pages.saturating_sub(1);
        let lease = host
            .lease(usable)
            .map_err(|e| KvError::Setup(e.to_string()))?;
        let cache = RadixCache::with_host_lease(&cache_config, lease)
            .map_err(|e| KvError::Setup(e.to_string()))?;
        Ok(Self {
            core,
            cache,
            host,
            device,
            l3,
        })
    }
}
