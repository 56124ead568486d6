//! The calls a workload makes, over either path: the direct core or the actor system.

use kvtier::{BlockingHandle, KvError, LocalSystem, Runtime, System};
use kvtier_device::{DeviceCore, NewRequest};
use kvtier_fsm::Scheduler;
use kvtier_l3::L3Core;
use kvtier_types::{EngineEvent, ExecutionPlan, KvEvent, RequestSpec, SchedulerConfig};

/// Which path a workload drives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Path {
    /// The scheduler core over its own cache (and the device core), called directly.
    #[default]
    Core,
    /// The actix actor system on the caller's thread ([`kvtier::LocalSystem`]).
    Actors,
    /// The actix actor system on its own thread, through the blocking handle.
    ActorsThreaded,
    /// The deterministic runtime on the caller's thread.
    Deterministic,
}

impl Path {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Path::Core => "core",
            Path::Actors => "actors",
            Path::ActorsThreaded => "actors-threaded",
            Path::Deterministic => "deterministic",
        }
    }

    fn runtime(self) -> Runtime {
        match self {
            Path::Deterministic => Runtime::Deterministic,
            _ => Runtime::Actix,
        }
    }
}

/// What a workload needs from a scheduler (and, for scenarios, its device).
pub trait SchedulerApi: std::fmt::Debug {
    /// The configuration.
    fn config(&self) -> &SchedulerConfig;
    /// Queue requests.
    fn submit(&mut self, specs: Vec<RequestSpec>) -> Result<(), KvError>;
    /// The next plan.
    fn next_plan(&mut self) -> Result<ExecutionPlan, KvError>;
    /// Apply engine events.
    fn advance(&mut self, events: Vec<EngineEvent>) -> Result<(), KvError>;
    /// KV-cache events since the last call.
    fn drain_kv_events(&mut self) -> Vec<KvEvent>;
    /// Whether nothing is running, queued or in flight.
    fn is_idle(&mut self) -> Result<bool, KvError>;
    /// Runs a plan on the device (copies, then forward rows); the events to advance.
    fn execute(
        &mut self,
        _plan: &ExecutionPlan,
        _new_requests: Vec<NewRequest>,
    ) -> Result<Vec<EngineEvent>, KvError> {
        Err(KvError::NoDevice)
    }
    /// Takes the device core out (at the end of a run).
    fn take_device(&mut self) -> Result<Option<DeviceCore>, KvError> {
        Ok(None)
    }
    /// The L3 actor's counters, when there is one.
    fn l3_stats(&mut self) -> Result<Option<kvtier_l3::L3TierStats>, KvError> {
        Ok(None)
    }
}

impl SchedulerApi for Scheduler {
    fn config(&self) -> &SchedulerConfig {
        Scheduler::config(self)
    }

    fn submit(&mut self, specs: Vec<RequestSpec>) -> Result<(), KvError> {
        Ok(Scheduler::submit(self, specs)?)
    }

    fn next_plan(&mut self) -> Result<ExecutionPlan, KvError> {
        Ok(Scheduler::next_plan(self))
    }

    fn advance(&mut self, events: Vec<EngineEvent>) -> Result<(), KvError> {
        Ok(Scheduler::advance(self, events)?)
    }

    fn drain_kv_events(&mut self) -> Vec<KvEvent> {
        Scheduler::drain_kv_events(self)
    }

    fn is_idle(&mut self) -> Result<bool, KvError> {
        Ok(Scheduler::is_idle(self))
    }
}

/// The direct path with a device: the scheduler core over its cache, the device core and
/// the L3 core, all called in place.
#[derive(Debug)]
pub struct DirectSystem {
    scheduler: Scheduler,
    device: Option<DeviceCore>,
    l3: Option<L3Core>,
}

impl SchedulerApi for DirectSystem {
    fn config(&self) -> &SchedulerConfig {
        self.scheduler.config()
    }

    fn submit(&mut self, mut specs: Vec<RequestSpec>) -> Result<(), KvError> {
        let config = self.scheduler.config();
        if let Some(l3) = self.l3.as_mut().filter(|_| config.l3_prefetch_enabled()) {
            l3.lookup(&mut specs, config.prefetch_threshold);
        }
        Ok(self.scheduler.submit(specs)?)
    }

    fn next_plan(&mut self) -> Result<ExecutionPlan, KvError> {
        Ok(self.scheduler.next_plan())
    }

    fn advance(&mut self, events: Vec<EngineEvent>) -> Result<(), KvError> {
        Ok(self.scheduler.advance(events)?)
    }

    fn drain_kv_events(&mut self) -> Vec<KvEvent> {
        self.scheduler.drain_kv_events()
    }

    fn is_idle(&mut self) -> Result<bool, KvError> {
        Ok(self.scheduler.is_idle())
    }

    fn execute(
        &mut self,
        plan: &ExecutionPlan,
        new_requests: Vec<NewRequest>,
    ) -> Result<Vec<EngineEvent>, KvError> {
        let device = self.device.as_mut().ok_or(KvError::NoDevice)?;
        let mut events = device.execute(plan, &new_requests)?;
        if let Some(l3) = &mut self.l3 {
            events.extend(l3.transfer(&plan.prefetches, &plan.backups));
        }
        Ok(events)
    }

    fn take_device(&mut self) -> Result<Option<DeviceCore>, KvError> {
        Ok(self.device.take())
    }

    fn l3_stats(&mut self) -> Result<Option<kvtier_l3::L3TierStats>, KvError> {
        Ok(self.l3.as_ref().map(L3Core::stats))
    }
}

/// A system builder on `runtime`, with a device and an L3 actor when they are given.
fn builder(
    config: &SchedulerConfig,
    runtime: Runtime,
    device: Option<DeviceCore>,
    l3: Option<L3Core>,
) -> kvtier::SystemBuilder {
    let mut builder = System::builder(config.clone()).runtime(runtime);
    if let Some(device) = device {
        builder = builder.device(device);
    }
    if let Some(l3) = l3 {
        builder = builder.l3(l3);
    }
    builder
}

/// The actor system on its own thread, as a workload sees it. Shuts the system down
/// when dropped.
#[derive(Debug)]
pub struct ActorScheduler {
    handle: BlockingHandle,
    config: SchedulerConfig,
}

impl ActorScheduler {
    /// Starts a system on `runtime`, with a device and an L3 actor when they are given.
    pub fn start(
        config: SchedulerConfig,
        runtime: Runtime,
        device: Option<DeviceCore>,
        l3: Option<L3Core>,
    ) -> Result<Self, KvError> {
        Ok(Self {
            handle: BlockingHandle::new(builder(&config, runtime, device, l3).start()?),
            config,
        })
    }

    /// The handle.
    pub fn handle(&self) -> &BlockingHandle {
        &self.handle
    }
}

impl Drop for ActorScheduler {
    fn drop(&mut self) {
        let _ = self.handle.shutdown();
    }
}

impl SchedulerApi for ActorScheduler {
    fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    fn submit(&mut self, specs: Vec<RequestSpec>) -> Result<(), KvError> {
        self.handle.submit(specs)
    }

    fn next_plan(&mut self) -> Result<ExecutionPlan, KvError> {
        self.handle.next_plan()
    }

    fn advance(&mut self, events: Vec<EngineEvent>) -> Result<(), KvError> {
        self.handle.advance(events)
    }

    fn drain_kv_events(&mut self) -> Vec<KvEvent> {
        self.handle.take_kv_events().unwrap_or_default()
    }

    fn is_idle(&mut self) -> Result<bool, KvError> {
        Ok(self.handle.stats()?.scheduler.idle)
    }

    fn execute(
        &mut self,
        plan: &ExecutionPlan,
        new_requests: Vec<NewRequest>,
    ) -> Result<Vec<EngineEvent>, KvError> {
        self.handle.execute(plan, new_requests)
    }

    fn take_device(&mut self) -> Result<Option<DeviceCore>, KvError> {
        self.handle.take_device()
    }

    fn l3_stats(&mut self) -> Result<Option<kvtier_l3::L3TierStats>, KvError> {
        Ok(self.handle.stats()?.l3)
    }
}

/// The actor system on the caller's thread, as a workload sees it.
#[derive(Debug)]
pub struct LocalActors {
    system: Option<LocalSystem>,
    config: SchedulerConfig,
}

impl LocalActors {
    /// Starts a system on `runtime`, on this thread, with a device and an L3 actor when
    /// they are given.
    pub fn start(
        config: SchedulerConfig,
        runtime: Runtime,
        device: Option<DeviceCore>,
        l3: Option<L3Core>,
    ) -> Result<Self, KvError> {
        Ok(Self {
            system: Some(builder(&config, runtime, device, l3).start_local()?),
            config,
        })
    }

    fn system(&mut self) -> Result<&mut LocalSystem, KvError> {
        self.system.as_mut().ok_or(KvError::ShutDown)
    }
}

impl Drop for LocalActors {
    fn drop(&mut self) {
        if let Some(system) = self.system.take() {
            let _ = system.shutdown();
        }
    }
}

impl SchedulerApi for LocalActors {
    fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    fn submit(&mut self, specs: Vec<RequestSpec>) -> Result<(), KvError> {
        self.system()?.submit(specs)
    }

    fn next_plan(&mut self) -> Result<ExecutionPlan, KvError> {
        self.system()?.next_plan()
    }

    fn advance(&mut self, events: Vec<EngineEvent>) -> Result<(), KvError> {
        self.system()?.advance(events)
    }

    fn drain_kv_events(&mut self) -> Vec<KvEvent> {
        self.system()
            .and_then(|s| s.take_kv_events())
            .unwrap_or_default()
    }

    fn is_idle(&mut self) -> Result<bool, KvError> {
        Ok(self.system()?.stats()?.scheduler.idle)
    }

    fn execute(
        &mut self,
        plan: &ExecutionPlan,
        new_requests: Vec<NewRequest>,
    ) -> Result<Vec<EngineEvent>, KvError> {
        self.system()?.execute(plan, new_requests)
    }

    fn take_device(&mut self) -> Result<Option<DeviceCore>, KvError> {
        self.system()?.take_device()
    }

    fn l3_stats(&mut self) -> Result<Option<kvtier_l3::L3TierStats>, KvError> {
        Ok(self.system()?.stats()?.l3)
    }
}

/// A scheduler on `path` (no device: the workload plays the engine itself).
pub fn scheduler_on(path: Path, config: SchedulerConfig) -> Result<Box<dyn SchedulerApi>, KvError> {
    Ok(match path {
        Path::Core => Box::new(Scheduler::new(config)?),
        Path::ActorsThreaded => {
            Box::new(ActorScheduler::start(config, Runtime::Actix, None, None)?)
        }
        Path::Actors | Path::Deterministic => {
            Box::new(LocalActors::start(config, path.runtime(), None, None)?)
        }
    })
}

/// A whole system on `path`: the scheduler, the device actor over `device`, and the L3
/// actor over `l3` when one is given.
pub fn system_on(
    path: Path,
    config: SchedulerConfig,
    device: DeviceCore,
    l3: Option<L3Core>,
) -> Result<Box<dyn SchedulerApi>, KvError> {
    let device = Some(device);
    Ok(match path {
        Path::Core => Box::new(DirectSystem {
            scheduler: Scheduler::new(config)?,
            device,
            l3,
        }),
        Path::ActorsThreaded => {
            Box::new(ActorScheduler::start(config, Runtime::Actix, device, l3)?)
        }
        Path::Actors | Path::Deterministic => {
            Box::new(LocalActors::start(config, path.runtime(), device, l3)?)
        }
    })
}
