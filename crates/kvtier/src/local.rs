//! The system on the caller's thread: the actors run while a call waits for its answer,
//! so no message crosses a thread. For an engine loop that owns its scheduling thread.

use actix::{Addr, SystemRunner};
use kvtier_device::{DeviceCore, NewRequest};
use kvtier_types::{EngineEvent, ExecutionPlan, KvEvent, RequestId, RequestSpec};

use crate::messages::*;
use crate::runtime::actix::{Addrs, SchedulerActor};
use crate::runtime::deterministic::Bus;
use crate::{KvError, Parts};

enum Inner {
    Actix {
        runner: SystemRunner,
        scheduler: Addr<SchedulerActor>,
        addrs: Addrs,
    },
    Bus(Box<Bus>),
}

/// A system whose actors run on the thread that calls it (not `Send`). The same actors,
/// messages and decisions as a [`crate::Handle`]'s system; only the thread hop is gone.
pub struct LocalSystem {
    inner: Inner,
}

impl std::fmt::Debug for LocalSystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let runtime = match &self.inner {
            Inner::Actix { .. } => "actix",
            Inner::Bus(_) => "deterministic",
        };
        f.debug_struct("LocalSystem")
            .field("runtime", &runtime)
            .finish()
    }
}

impl LocalSystem {
    pub(crate) fn actix(parts: Parts) -> Self {
        let runner = actix::System::new();
        let addrs = runner.block_on(async move { crate::runtime::actix::start(parts, false) });
        Self {
            inner: Inner::Actix {
                runner,
                scheduler: addrs.scheduler.clone(),
                addrs,
            },
        }
    }

    pub(crate) fn bus(bus: Bus) -> Self {
        Self {
            inner: Inner::Bus(Box::new(bus)),
        }
    }

    fn call<M>(
        runner: &SystemRunner,
        addr: &Addr<SchedulerActor>,
        msg: M,
    ) -> Result<M::Result, KvError>
    where
        M: actix::Message + Send + 'static,
        M::Result: Send,
        SchedulerActor: actix::Handler<M>,
    {
        runner
            .block_on(addr.send(msg))
            .map_err(|_| KvError::ShutDown)
    }

    /// See [`crate::Handle::submit`].
    pub fn submit(&mut self, specs: Vec<RequestSpec>) -> Result<(), KvError> {
        let span = tracing::Span::current();
        match &mut self.inner {
            Inner::Actix {
                runner, scheduler, ..
            } => Self::call(runner, scheduler, Submit { specs, span })?,
            Inner::Bus(bus) => bus.submit(specs),
        }
    }

    /// See [`crate::Handle::next_plan`].
    pub fn next_plan(&mut self) -> Result<ExecutionPlan, KvError> {
        let span = tracing::Span::current();
        match &mut self.inner {
            Inner::Actix {
                runner, scheduler, ..
            } => Self::call(runner, scheduler, NextPlan { span })?,
            Inner::Bus(bus) => bus.next_plan(),
        }
    }

    /// See [`crate::Handle::advance`].
    pub fn advance(&mut self, events: Vec<EngineEvent>) -> Result<(), KvError> {
        let span = tracing::Span::current();
        match &mut self.inner {
            Inner::Actix {
                runner, scheduler, ..
            } => Self::call(runner, scheduler, Advance { events, span })?,
            Inner::Bus(bus) => bus.advance(events),
        }
    }

    /// See [`crate::Handle::abort`].
    pub fn abort(&mut self, id: RequestId) -> Result<(), KvError> {
        let span = tracing::Span::current();
        match &mut self.inner {
            Inner::Actix {
                runner, scheduler, ..
            } => Self::call(runner, scheduler, Abort { id, span })?,
            Inner::Bus(bus) => bus.abort(&id),
        }
    }

    /// See [`crate::Handle::stats`].
    pub fn stats(&mut self) -> Result<SystemStats, KvError> {
        match &mut self.inner {
            Inner::Actix {
                runner, scheduler, ..
            } => Self::call(runner, scheduler, Stats)?,
            Inner::Bus(bus) => bus.stats(),
        }
    }

    /// See [`crate::Handle::take_kv_events`].
    pub fn take_kv_events(&mut self) -> Result<Vec<KvEvent>, KvError> {
        match &mut self.inner {
            Inner::Actix {
                runner, scheduler, ..
            } => Self::call(runner, scheduler, TakeKvEvents)?,
            Inner::Bus(bus) => bus.take_kv_events(),
        }
    }

    /// See [`crate::Handle::execute`].
    pub fn execute(
        &mut self,
        plan: &ExecutionPlan,
        new_requests: Vec<NewRequest>,
    ) -> Result<Vec<EngineEvent>, KvError> {
        match &mut self.inner {
            Inner::Actix { runner, addrs, .. } => runner.block_on(crate::runtime::actix::execute(
                addrs,
                plan.clone(),
                new_requests,
                tracing::Span::current(),
            )),
            Inner::Bus(bus) => bus.execute(plan.clone(), new_requests),
        }
    }

    /// See [`crate::Handle::take_device`].
    pub fn take_device(&mut self) -> Result<Option<DeviceCore>, KvError> {
        match &mut self.inner {
            Inner::Actix { runner, addrs, .. } => match &addrs.device {
                Some(device) => runner
                    .block_on(device.send(TakeDevice))
                    .map_err(|_| KvError::ShutDown),
                None => Ok(None),
            },
            Inner::Bus(bus) => Ok(bus.take_device()),
        }
    }

    /// See [`crate::Handle::shutdown`].
    pub fn shutdown(self) -> Result<ShutdownReport, KvError> {
        match self.inner {
            Inner::Actix {
                runner, scheduler, ..
            } => Self::call(&runner, &scheduler, Shutdown),
            Inner::Bus(mut bus) => Ok(bus.shutdown()),
        }
    }
}
