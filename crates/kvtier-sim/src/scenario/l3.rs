//! The L3 arrangements of a scenario: the store, its injected faults, and the L3 core over
//! it.

use kvtier_l3::{
    L3Backend, L3Core, L3Error, L3Faults, L3Key, LocalStore, LocalStoreConfig, MooncakeConfig,
    MooncakeStore, Namespace,
};

use super::*;

/// The L3 store a scenario runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum L3Store {
    /// No L3 tier.
    Off,
    /// The embedded `LocalStore`, in a fresh directory (or `ScenarioOptions::l3_dir`).
    Local,
    /// A Mooncake cluster described by the environment (`cargo xtask mooncake run`).
    Mooncake,
}

impl L3Store {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            L3Store::Off => "off",
            L3Store::Local => "local",
            L3Store::Mooncake => "mooncake",
        }
    }
}

/// Faults injected at the L3 actor (on top of whatever the real store does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L3Fault {
    /// None.
    None,
    /// Every `n`-th prefetch finds the store down: the get fails outright.
    FailEveryNthGet(u64),
    /// Every `n`-th prefetch finds the second half of its objects gone (evicted between
    /// the lookup and the get, as Mooncake does silently): they are removed from the
    /// store just before the get.
    LoseHalfOfEveryNthGet(u64),
    /// Every `n`-th prefetch of two or more objects finds its first key holding the
    /// bytes of its second (a store that maps a key to the wrong object, with its own
    /// checks passing): only the integrity oracle can catch it.
    ServeWrongObjectOnEveryNthGet(u64),
    /// Every `n`-th backup finds the store down: nothing is stored.
    FailEveryNthPut(u64),
    /// Every `n`-th backup stores the first half of its objects, then fails (the L3
    /// actor takes that half back: a backup is all or nothing).
    StoreHalfOfEveryNthPut(u64),
    /// Every `n`-th submit-time lookup finds the store down (no hits).
    FailEveryNthLookup(u64),
}

/// The error an injected outage gives.
fn store_down() -> L3Error {
    L3Error::Io {
        path: "injected".into(),
        source: std::io::Error::other("the L3 store is down"),
    }
}

/// The L3 fault hooks of a scenario run.
#[derive(Debug)]
struct ScenarioFaults {
    fault: L3Fault,
    gets: u64,
    puts: u64,
    lookups: u64,
    /// Bytes of one object (one page).
    page_bytes: usize,
}

impl L3Faults for ScenarioFaults {
    fn before_get(&mut self, keys: &[L3Key], backend: &mut dyn L3Backend) -> Result<(), L3Error> {
        self.gets += 1;
        match self.fault {
            L3Fault::FailEveryNthGet(n) if n > 0 && self.gets.is_multiple_of(n) => {
                Err(store_down())
            }
            L3Fault::LoseHalfOfEveryNthGet(n) if n > 0 && self.gets.is_multiple_of(n) => {
                backend.remove(&keys[keys.len() / 2..])?;
                Ok(())
            }
            L3Fault::ServeWrongObjectOnEveryNthGet(n)
                if n > 0 && self.gets.is_multiple_of(n) && keys.len() >= 2 =>
            {
                let mut other = vec![0u8; self.page_bytes];
                if backend.get(&keys[1..2], &mut [&mut other[..]])? == [true] {
                    backend.remove(&keys[..1])?;
                    backend.put(&keys[..1], &[&other[..]])?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn before_put(&mut self, keys: &[L3Key]) -> Result<usize, L3Error> {
        self.puts += 1;
        match self.fault {
            L3Fault::FailEveryNthPut(n) if n > 0 && self.puts.is_multiple_of(n) => {
                Err(store_down())
            }
            L3Fault::StoreHalfOfEveryNthPut(n) if n > 0 && self.puts.is_multiple_of(n) => {
                Ok(keys.len() / 2)
            }
            _ => Ok(keys.len()),
        }
    }

    fn before_exists(&mut self, _keys: &[L3Key]) -> Result<(), L3Error> {
        self.lookups += 1;
        match self.fault {
            L3Fault::FailEveryNthLookup(n) if n > 0 && self.lookups.is_multiple_of(n) => {
                Err(store_down())
            }
            _ => Ok(()),
        }
    }
}

/// A fresh directory under the temporary directory, removed when dropped (the default
/// home of a run's `LocalStore`).
pub(crate) fn scratch_dir(what: &str) -> Result<tempfile::TempDir, ScenarioError> {
    tempfile::Builder::new()
        .prefix(&format!("kvtier-{what}-"))
        .tempdir()
        .map_err(|e| ScenarioError::L3(format!("cannot make a temporary directory: {e}")))
}

/// The Mooncake cluster to use: the one given, else the one the environment describes
/// (`cargo xtask mooncake run`).
pub(crate) fn mooncake_cluster(
    given: Option<&MooncakeConfig>,
) -> Result<MooncakeConfig, ScenarioError> {
    given
        .cloned()
        .or_else(MooncakeConfig::from_env)
        .ok_or_else(|| {
            ScenarioError::L3(
                "no Mooncake cluster in the environment: run this under `cargo xtask \
                 mooncake run -- ...`"
                    .into(),
            )
        })
}

/// The L3 actor's core over `backend`, keyed under `model` (the oracle engine's KV
/// layout), moving pages of `arena`.
pub(crate) fn l3_core_over(
    backend: Box<dyn L3Backend>,
    model: &str,
    page_size: u32,
    arena: std::sync::Arc<kvtier_host::HostArena>,
) -> Result<L3Core, ScenarioError> {
    let namespace = Namespace::new(model, "u16", "page-first", page_size, 1, 0)?;
    Ok(L3Core::new(backend, namespace, page_size, arena)?)
}

/// The L3 actor's core for a run: the store the options name, over the device's host
/// arena (and host state arena, for a hybrid model). The scratch directory, if one was
/// made, must outlive the core.
pub(super) fn l3_core(
    o: &ScenarioOptions,
    page_size: u32,
    arena: std::sync::Arc<kvtier_host::HostArena>,
    states: Option<std::sync::Arc<kvtier_host::HostArena>>,
    scratch: &mut Option<tempfile::TempDir>,
    shared: Option<Box<dyn L3Backend>>,
) -> Result<Option<L3Core>, ScenarioError> {
    if !o.l3_on() {
        return Ok(None);
    }
    let backend: Box<dyn L3Backend> = match (o.l3, shared) {
        (L3Store::Off, _) => return Ok(None),
        (_, Some(shared)) => shared,
        (L3Store::Local, None) => {
            let dir = match &o.l3_dir {
                Some(dir) => dir.clone(),
                None => scratch
                    .insert(scratch_dir(&format!("{}-l3", o.scenario.name()))?)
                    .path()
                    .to_path_buf(),
            };
            Box::new(LocalStore::open(LocalStoreConfig::new(
                dir,
                o.l3_memory_bytes,
                1 << 30,
            ))?)
        }
        (L3Store::Mooncake, None) => {
            let config = mooncake_cluster(o.mooncake.as_ref())?;
            let mut store = MooncakeStore::connect(&config)?;
            store.register_arena(&arena)?;
            if let Some(states) = &states {
                store.register_arena(states)?;
            }
            Box::new(store)
        }
    };
    let page_bytes = arena.page_bytes();
    let mut core = l3_core_over(backend, &o.l3_model, page_size, arena)?;
    if let Some(states) = states {
        core = core.with_states(states);
    }
    Ok(Some(core.with_faults(Box::new(ScenarioFaults {
        fault: o.l3_fault,
        gets: 0,
        puts: 0,
        lookups: 0,
        page_bytes,
    }))))
}
