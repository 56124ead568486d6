//! One actor on a thread of its own, outside a system: for tools and benchmarks that
//! drive a core the way a system does (`kvtier bench l3`), through the same generic
//! shell and the same mail.

use std::thread::JoinHandle;

use actix::{Actor, Addr};
use kvtier_l3::L3Core;
use kvtier_types::{ActorCore, BackupOp, EngineEvent, PrefetchOp};

use crate::handle::block_on;
use crate::mail::{Mail, Slot};
use crate::runtime::actix::{Deliver, Shell};
use crate::{KvError, SetupError};

/// An actor over `C` on a thread of its own. Dropping it stops the actor and joins the
/// thread (the core is dropped there).
#[derive(Debug)]
pub struct Service<C> {
    addr: Addr<Shell>,
    system: actix::System,
    thread: Option<JoinHandle<()>>,
    core: std::marker::PhantomData<fn() -> C>,
}

impl<C: ActorCore + std::fmt::Debug> Service<C> {
    /// Starts the actor over `core`.
    pub fn start(core: C) -> Result<Self, KvError> {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("kvtier-{}", C::NAME))
            .spawn(move || {
                let system = actix::System::new();
                let started = system.block_on(async move {
                    let shell = Shell::new(Slot::boxed(core));
                    (shell.start(), actix::System::current())
                });
                if tx.send(started).is_ok() {
                    let _ = system.run();
                }
            })
            .map_err(|_| SetupError::Thread("service"))?;
        let (addr, system) = rx.recv().map_err(|_| SetupError::Thread("service"))?;
        Ok(Self {
            addr,
            system,
            thread: Some(thread),
            core: std::marker::PhantomData,
        })
    }

    /// Sends one message and blocks until the actor answers.
    pub fn ask(&self, msg: C::Msg) -> Result<C::Reply, KvError> {
        let mail = Mail::to::<C>(msg, &tracing::Span::current());
        let answer =
            block_on(self.addr.send(Deliver(mail))).map_err(|_| KvError::ActorGone(C::NAME))??;
        answer.reply::<C>()
    }
}

impl<C> Drop for Service<C> {
    fn drop(&mut self) {
        self.system.stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The L3 store actor on its own thread.
pub type L3Service = Service<L3Core>;

impl Service<L3Core> {
    /// Runs prefetches and backups, as a system's `execute` does: one `PrefetchDone`
    /// per prefetch, then one `BackupDone` per backup.
    pub fn transfer(
        &self,
        prefetches: Vec<PrefetchOp>,
        backups: Vec<BackupOp>,
    ) -> Result<Vec<EngineEvent>, KvError> {
        match self.ask(kvtier_l3::L3Msg::L3Transfer {
            prefetches,
            backups,
        })? {
            kvtier_l3::L3Reply::L3Transferred(events) => Ok(events),
            _ => Err(KvError::UnexpectedAnswer {
                from: kvtier_types::ActorName::L3,
                answer: "not L3Transferred",
            }),
        }
    }
}
