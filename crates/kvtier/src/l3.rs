//! An L3 store actor on its own, outside a system: for tools and benchmarks that drive
//! the store the way a system does (`kvtier bench l3`), through the same actor and the
//! same messages.

use std::thread::JoinHandle;

use actix::{Actor, Addr};
use kvtier_l3::L3Core;
use kvtier_types::{BackupOp, EngineEvent, PrefetchOp};

use crate::KvError;
use crate::handle::block_on;
use crate::messages::L3Transfer;
use crate::runtime::actix::L3Actor;

/// An L3 store actor on a thread of its own. Dropping it stops the actor and joins the
/// thread (the core, and its backend, are dropped there).
#[derive(Debug)]
pub struct L3Service {
    addr: Addr<L3Actor>,
    system: actix::System,
    thread: Option<JoinHandle<()>>,
}

impl L3Service {
    /// Starts the actor over `core`.
    pub fn start(core: L3Core) -> Result<Self, KvError> {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("kvtier-l3".into())
            .spawn(move || {
                let system = actix::System::new();
                let started = system.block_on(async move {
                    (L3Actor::new(core).start(), actix::System::current())
                });
                if tx.send(started).is_ok() {
                    let _ = system.run();
                }
            })
            .map_err(|e| KvError::Setup(format!("cannot start the L3 thread: {e}")))?;
        let (addr, system) = rx
            .recv()
            .map_err(|_| KvError::Setup("the L3 actor did not start".into()))?;
        Ok(Self {
            addr,
            system,
            thread: Some(thread),
        })
    }

    /// Runs prefetches and backups, as a system's `execute` does; blocks until the
    /// actor answers with one `PrefetchDone` per prefetch, then one `BackupDone` per
    /// backup.
    pub fn transfer(
        &self,
        prefetches: Vec<PrefetchOp>,
        backups: Vec<BackupOp>,
    ) -> Result<Vec<EngineEvent>, KvError> {
        block_on(self.addr.send(L3Transfer {
            prefetches,
            backups,
            span: tracing::Span::current(),
        }))
        .map_err(|_| KvError::ActorGone("l3"))
    }
}

impl Drop for L3Service {
    fn drop(&mut self) {
        self.system.stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
