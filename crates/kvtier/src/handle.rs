//! The handle embedders hold, and its blocking wrapper.

use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, JoinHandle, Thread};

use kvtier_device::{DeviceCore, NewRequest};
use kvtier_types::{EngineEvent, ExecutionPlan, KvEvent, RequestId, RequestSpec};
use tokio::sync::oneshot;

use crate::messages::*;
use crate::runtime::actix::{Addrs, SchedulerActor};
use crate::runtime::deterministic::{Bus, FaultHooks};
use crate::{KvError, Parts};

/// A call to the deterministic runtime's thread.
#[derive(Debug)]
enum Command {
    Submit(Vec<RequestSpec>, oneshot::Sender<Result<(), KvError>>),
    Advance(Vec<EngineEvent>, oneshot::Sender<Result<(), KvError>>),
    Abort(RequestId, oneshot::Sender<Result<(), KvError>>),
    NextPlan(oneshot::Sender<Result<ExecutionPlan, KvError>>),
    Stats(oneshot::Sender<Result<SystemStats, KvError>>),
    TakeKvEvents(oneshot::Sender<Result<Vec<KvEvent>, KvError>>),
    Execute(
        Box<ExecutionPlan>,
        Vec<NewRequest>,
        oneshot::Sender<Result<Vec<EngineEvent>, KvError>>,
    ),
    TakeDevice(oneshot::Sender<Option<DeviceCore>>),
    Shutdown(oneshot::Sender<ShutdownReport>),
}

#[derive(Debug, Clone)]
enum Backend {
    Actix(Addrs),
    /// Commands with the caller's span, entered while the bus handles them.
    Bus(flume::Sender<(Command, tracing::Span)>),
}

/// The system's thread, joined at shutdown (not scheduler or cache state).
type Thread_ = Arc<Mutex<Option<JoinHandle<()>>>>;

/// A running system. Cheap to clone; every clone talks to the same actors.
#[derive(Debug, Clone)]
pub struct Handle {
    backend: Backend,
    thread: Thread_,
}

impl Handle {
    pub(crate) fn start_actix(parts: Parts) -> Result<Self, KvError> {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = thread::Builder::new()
            .name("kvtier-actors".into())
            .spawn(move || {
                let system = actix::System::new();
                let addr =
                    system.block_on(async move { crate::runtime::actix::start(parts, true) });
                if tx.send(addr).is_ok() {
                    let _ = system.run();
                }
            })
            .map_err(|e| KvError::Setup(format!("cannot start the actor thread: {e}")))?;
        let addr = rx
            .recv()
            .map_err(|_| KvError::Setup("the actor system did not start".into()))?;
        Ok(Self {
            backend: Backend::Actix(addr),
            thread: Arc::new(Mutex::new(Some(thread))),
        })
    }

    pub(crate) fn start_bus(parts: Parts, hooks: Box<dyn FaultHooks>) -> Result<Self, KvError> {
        let (tx, rx) = flume::unbounded::<(Command, tracing::Span)>();
        let mut bus = Bus::new(parts, hooks);
        let thread = thread::Builder::new()
            .name("kvtier-bus".into())
            .spawn(move || {
                while let Ok((command, span)) = rx.recv() {
                    let _entered = span.enter();
                    // A caller that went away drops its answer; the bus goes on.
                    match command {
                        Command::Submit(specs, r) => drop(r.send(bus.submit(specs))),
                        Command::Advance(events, r) => drop(r.send(bus.advance(events))),
                        Command::Abort(id, r) => drop(r.send(bus.abort(&id))),
                        Command::NextPlan(r) => drop(r.send(bus.next_plan())),
                        Command::Stats(r) => drop(r.send(bus.stats())),
                        Command::TakeKvEvents(r) => drop(r.send(bus.take_kv_events())),
                        Command::Execute(plan, new, r) => drop(r.send(bus.execute(*plan, new))),
                        Command::TakeDevice(r) => drop(r.send(bus.take_device())),
                        Command::Shutdown(r) => {
                            drop(r.send(bus.shutdown()));
                            break;
                        }
                    }
                }
            })
            .map_err(|e| KvError::Setup(format!("cannot start the bus thread: {e}")))?;
        Ok(Self {
            backend: Backend::Bus(tx),
            thread: Arc::new(Mutex::new(Some(thread))),
        })
    }

    async fn bus<T>(
        tx: &flume::Sender<(Command, tracing::Span)>,
        command: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, KvError> {
        let (reply, answer) = oneshot::channel();
        tx.send((command(reply), tracing::Span::current()))
            .map_err(|_| KvError::ShutDown)?;
        answer.await.map_err(|_| KvError::ShutDown)
    }

    async fn actix<M>(addrs: &Addrs, msg: M) -> Result<M::Result, KvError>
    where
        M: actix::Message + Send + 'static,
        M::Result: Send,
        SchedulerActor: actix::Handler<M>,
    {
        addrs
            .scheduler
            .send(msg)
            .await
            .map_err(|_| KvError::ShutDown)
    }

    /// Runs a plan's copies on the device actor, then its forward rows through the
    /// device's model runner, and its L3 prefetches and backups on the L3 actor at the
    /// same time; returns the events to `advance` with (the device's, then the L3
    /// actor's). `new_requests` announces the requests submitted since the last plan to
    /// the runner.
    pub async fn execute(
        &self,
        plan: &ExecutionPlan,
        new_requests: Vec<NewRequest>,
    ) -> Result<Vec<EngineEvent>, KvError> {
        let span = tracing::Span::current();
        match &self.backend {
            Backend::Actix(a) => {
                crate::runtime::actix::execute(a, plan.clone(), new_requests, span).await
            }
            Backend::Bus(tx) => {
                let plan = Box::new(plan.clone());
                Self::bus(tx, |r| Command::Execute(plan, new_requests, r)).await?
            }
        }
    }

    /// Takes the device core out of the system (to read its model runner at the end of
    /// a run). Later `execute` calls fail with [`KvError::NoDevice`].
    pub async fn take_device(&self) -> Result<Option<DeviceCore>, KvError> {
        match &self.backend {
            Backend::Actix(a) => match &a.device {
                Some(device) => device.send(TakeDevice).await.map_err(|_| KvError::ShutDown),
                None => Ok(None),
            },
            Backend::Bus(tx) => Self::bus(tx, Command::TakeDevice).await,
        }
    }

    /// Queues requests. Invalid ones come back in [`KvError::Batch`]; the rest are queued.
    pub async fn submit(&self, specs: Vec<RequestSpec>) -> Result<(), KvError> {
        let span = tracing::Span::current();
        match &self.backend {
            Backend::Actix(a) => Self::actix(a, Submit { specs, span }).await?,
            Backend::Bus(tx) => Self::bus(tx, |r| Command::Submit(specs, r)).await?,
        }
    }

    /// Builds the next execution plan.
    pub async fn next_plan(&self) -> Result<ExecutionPlan, KvError> {
        let span = tracing::Span::current();
        match &self.backend {
            Backend::Actix(a) => Self::actix(a, NextPlan { span }).await?,
            Backend::Bus(tx) => Self::bus(tx, Command::NextPlan).await?,
        }
    }

    /// Applies engine events in order. Refused ones come back in [`KvError::Batch`].
    pub async fn advance(&self, events: Vec<EngineEvent>) -> Result<(), KvError> {
        let span = tracing::Span::current();
        match &self.backend {
            Backend::Actix(a) => Self::actix(a, Advance { events, span }).await?,
            Backend::Bus(tx) => Self::bus(tx, |r| Command::Advance(events, r)).await?,
        }
    }

    /// Aborts one request, whatever its state.
    pub async fn abort(&self, id: RequestId) -> Result<(), KvError> {
        let span = tracing::Span::current();
        match &self.backend {
            Backend::Actix(a) => Self::actix(a, Abort { id, span }).await?,
            Backend::Bus(tx) => Self::bus(tx, |r| Command::Abort(id, r)).await?,
        }
    }

    /// Counters and gauges of every actor.
    pub async fn stats(&self) -> Result<SystemStats, KvError> {
        match &self.backend {
            Backend::Actix(a) => Self::actix(a, Stats).await?,
            Backend::Bus(tx) => Self::bus(tx, Command::Stats).await?,
        }
    }

    /// KV-cache events collected since the last call.
    pub async fn take_kv_events(&self) -> Result<Vec<KvEvent>, KvError> {
        match &self.backend {
            Backend::Actix(a) => Self::actix(a, TakeKvEvents).await?,
            Backend::Bus(tx) => Self::bus(tx, Command::TakeKvEvents).await?,
        }
    }

    /// Drains what is in flight, stops the actors and reports anything still held.
    /// Later calls on any clone fail with [`KvError::ShutDown`].
    pub async fn shutdown(&self) -> Result<ShutdownReport, KvError> {
        let report = match &self.backend {
            Backend::Actix(a) => Self::actix(a, Shutdown).await?,
            Backend::Bus(tx) => Self::bus(tx, Command::Shutdown).await?,
        };
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(thread) = thread {
            let _ = thread.join();
        }
        Ok(report)
    }
}

/// The same calls for code outside async: each blocks the calling thread until the
/// answer arrives. Do not call it from inside the actors' own runtime.
#[derive(Debug, Clone)]
pub struct BlockingHandle {
    handle: Handle,
}

impl BlockingHandle {
    /// Wraps a handle.
    pub fn new(handle: Handle) -> Self {
        Self { handle }
    }

    /// The async handle.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// See [`Handle::submit`].
    pub fn submit(&self, specs: Vec<RequestSpec>) -> Result<(), KvError> {
        block_on(self.handle.submit(specs))
    }

    /// See [`Handle::next_plan`].
    pub fn next_plan(&self) -> Result<ExecutionPlan, KvError> {
        block_on(self.handle.next_plan())
    }

    /// See [`Handle::advance`].
    pub fn advance(&self, events: Vec<EngineEvent>) -> Result<(), KvError> {
        block_on(self.handle.advance(events))
    }

    /// See [`Handle::abort`].
    pub fn abort(&self, id: RequestId) -> Result<(), KvError> {
        block_on(self.handle.abort(id))
    }

    /// See [`Handle::stats`].
    pub fn stats(&self) -> Result<SystemStats, KvError> {
        block_on(self.handle.stats())
    }

    /// See [`Handle::take_kv_events`].
    pub fn take_kv_events(&self) -> Result<Vec<KvEvent>, KvError> {
        block_on(self.handle.take_kv_events())
    }

    /// See [`Handle::execute`].
    pub fn execute(
        &self,
        plan: &ExecutionPlan,
        new_requests: Vec<NewRequest>,
    ) -> Result<Vec<EngineEvent>, KvError> {
        block_on(self.handle.execute(plan, new_requests))
    }

    /// See [`Handle::take_device`].
    pub fn take_device(&self) -> Result<Option<DeviceCore>, KvError> {
        block_on(self.handle.take_device())
    }

    /// See [`Handle::shutdown`].
    pub fn shutdown(&self) -> Result<ShutdownReport, KvError> {
        block_on(self.handle.shutdown())
    }
}

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls before parking: answers from the actor thread usually come within
/// microseconds, sooner than a park and unpark.
const SPINS_BEFORE_PARK: u32 = 2000;

/// Runs a future to completion on the calling thread.
pub fn block_on<F: Future>(future: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    let mut spins = 0;
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        if spins < SPINS_BEFORE_PARK {
            spins += 1;
            std::hint::spin_loop();
        } else {
            thread::park();
        }
    }
}
