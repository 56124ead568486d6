//! The calls a workload makes, over either path: the direct core or the actor system.

use kvtier::{BlockingHandle, KvError, LocalSystem, Runtime, System};
use kvtier_fsm::Scheduler;
use kvtier_types::{EngineEvent, ExecutionPlan, KvEvent, RequestSpec, SchedulerConfig};

/// Which path a workload drives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Path {
    /// The scheduler core over its own cache, called directly.
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
}

/// What a workload needs from a scheduler.
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
}

/// The actor system as a workload sees it. Shuts the system down when dropped.
#[derive(Debug)]
pub struct ActorScheduler {
    handle: BlockingHandle,
    config: SchedulerConfig,
}

impl ActorScheduler {
    /// Starts a system on `runtime`.
    pub fn start(config: SchedulerConfig, runtime: Runtime) -> Result<Self, KvError> {
        let handle = System::builder(config.clone()).runtime(runtime).start()?;
        Ok(Self {
            handle: BlockingHandle::new(handle),
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
}

/// The actor system on the caller's thread, as a workload sees it.
#[derive(Debug)]
pub struct LocalActors {
    system: Option<LocalSystem>,
    config: SchedulerConfig,
}

impl LocalActors {
    /// Starts a system on `runtime`, on this thread.
    pub fn start(config: SchedulerConfig, runtime: Runtime) -> Result<Self, KvError> {
        let system = System::builder(config.clone())
            .runtime(runtime)
            .start_local()?;
        Ok(Self {
            system: Some(system),
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
}

/// A scheduler on `path`.
pub fn scheduler_on(path: Path, config: SchedulerConfig) -> Result<Box<dyn SchedulerApi>, KvError> {
    Ok(match path {
        Path::Core => Box::new(Scheduler::new(config)?),
        Path::Actors => Box::new(LocalActors::start(config, Runtime::Actix)?),
        Path::ActorsThreaded => Box::new(ActorScheduler::start(config, Runtime::Actix)?),
        Path::Deterministic => Box::new(LocalActors::start(config, Runtime::Deterministic)?),
    })
}
