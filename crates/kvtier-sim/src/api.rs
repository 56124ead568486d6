//! Which path a workload drives: the same embedding API ([`kvtier::LocalSystem`]) over
//! the direct path, the actix actors, or the deterministic bus.

use kvtier::{FaultHooks, KvError, LocalSystem, NoFaults, Runtime, System};
use kvtier_device::DeviceCore;
use kvtier_l3::L3Core;
use kvtier_types::SchedulerConfig;

/// Which path a workload drives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Path {
    /// The cores called in place (the direct runtime), on the caller's thread.
    #[default]
    Core,
    /// The actix actor system on the caller's thread.
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
            Path::Core => Runtime::Direct,
            Path::Deterministic => Runtime::Deterministic,
            Path::Actors | Path::ActorsThreaded => Runtime::Actix,
        }
    }
}

/// A system on `path`, with a device and an L3 actor when they are given.
pub fn system_on(
    path: Path,
    config: SchedulerConfig,
    device: Option<DeviceCore>,
    l3: Option<L3Core>,
) -> Result<LocalSystem, KvError> {
    system_with_hooks(path, config, device, l3, NoFaults)
}

/// [`system_on`] with fault hooks on every delivery (delays and picks reorder only the
/// deterministic bus).
pub fn system_with_hooks(
    path: Path,
    config: SchedulerConfig,
    device: Option<DeviceCore>,
    l3: Option<L3Core>,
    hooks: impl FaultHooks + 'static,
) -> Result<LocalSystem, KvError> {
    let mut builder = System::builder(config)
        .runtime(path.runtime())
        .fault_hooks(hooks);
    if let Some(device) = device {
        builder = builder.device(device);
    }
    if let Some(l3) = l3 {
        builder = builder.l3(l3);
    }
    match path {
        Path::ActorsThreaded => Ok(LocalSystem::from_handle(builder.start()?)),
        _ => builder.start_local(),
    }
}

/// A scheduler on `path` (no device: the workload plays the engine itself).
pub fn scheduler_on(path: Path, config: SchedulerConfig) -> Result<LocalSystem, KvError> {
    system_on(path, config, None, None)
}
