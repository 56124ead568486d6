//! The handle embedders hold, and its blocking wrapper.

use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, JoinHandle, Thread};

use actix::Addr;
use kvtier_device::{DeviceCore, NewRequest};
use kvtier_types::{ActorCore, EngineEvent, ExecutionPlan, KvEvent, RequestId, RequestSpec};
use tokio::sync::oneshot;

use crate::conversation::{Call, Outcome};
use crate::runtime::Driver;
use crate::runtime::actix::FrontActor;
use crate::{KvError, SetupError, ShutdownReport, SystemStats};

/// A call for a system on a thread of its own, with the caller's span.
type Command = (
    Call,
    tracing::Span,
    oneshot::Sender<Result<Outcome, KvError>>,
);

#[derive(Debug, Clone)]
enum Remote {
    /// The Scheduler actor, on the actix system's thread.
    Actix(Addr<FrontActor>),
    /// A driver (direct or deterministic) on its own thread.
    Thread(flume::Sender<Command>),
}

/// The system's thread, joined at shutdown.
type SystemThread = Arc<Mutex<Option<JoinHandle<()>>>>;

/// A running system. Cheap to clone; every clone talks to the same actors.
#[derive(Debug, Clone)]
pub struct Handle {
    remote: Remote,
    thread: SystemThread,
}

impl Handle {
    pub(crate) fn actix(
        start: impl FnOnce() -> Addr<FrontActor> + Send + 'static,
    ) -> Result<Self, KvError> {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = thread::Builder::new()
            .name("kvtier-actors".into())
            .spawn(move || {
                let system = actix::System::new();
                let front = system.block_on(async move { start() });
                if tx.send(front).is_ok() {
                    let _ = system.run();
                }
            })
            .map_err(|_| SetupError::Thread("actor"))?;
        let front = rx.recv().map_err(|_| SetupError::Thread("actor"))?;
        Ok(Self {
            remote: Remote::Actix(front),
            thread: Arc::new(Mutex::new(Some(thread))),
        })
    }

    pub(crate) fn driver(mut driver: Box<dyn Driver + Send>) -> Result<Self, KvError> {
        let (tx, rx) = flume::unbounded::<Command>();
        let thread = thread::Builder::new()
            .name("kvtier-system".into())
            .spawn(move || {
                while let Ok((call, span, reply)) = rx.recv() {
                    let shutdown = matches!(call, Call::Shutdown);
                    // A caller that went away drops its answer; the system goes on.
                    drop(reply.send(driver.call(call, span)));
                    if shutdown {
                        break;
                    }
                }
            })
            .map_err(|_| SetupError::Thread("system"))?;
        Ok(Self {
            remote: Remote::Thread(tx),
            thread: Arc::new(Mutex::new(Some(thread))),
        })
    }

    /// Runs one call on the system's thread.
    pub(crate) async fn call(&self, call: Call, span: tracing::Span) -> Result<Outcome, KvError> {
        let shutdown = matches!(call, Call::Shutdown);
        let outcome = match &self.remote {
            Remote::Actix(front) => crate::runtime::actix::call(front.clone(), call, span).await,
            Remote::Thread(tx) => {
                let (reply, answer) = oneshot::channel();
                tx.send((call, span, reply))
                    .map_err(|_| KvError::ShutDown)?;
                answer.await.map_err(|_| KvError::ShutDown)?
            }
        };
        if shutdown && outcome.is_ok() {
            let thread = self.thread.lock().ok().and_then(|mut t| t.take());
            if let Some(thread) = thread {
                let _ = thread.join();
            }
        }
        outcome
    }

    async fn run(&self, call: Call) -> Result<Outcome, KvError> {
        self.call(call, tracing::Span::current()).await
    }

    /// Queues requests. Invalid ones come back in [`KvError::Batch`]; the rest are queued.
    /// With an L3 store, prompts long enough to be prefetched are looked up first: their
    /// requests wait, looking up, while plans go on without them (a slow store holds
    /// back its requests, not the system). Lookup answers take effect at the next call
    /// that uses the scheduler (plan, advance, abort, stats).
    pub async fn submit(&self, specs: Vec<RequestSpec>) -> Result<(), KvError> {
        self.run(Call::Submit(specs)).await?.done()
    }

    /// Returns once every L3 lookup sent so far has answered, so that the next plan
    /// sees them all. A replay on a virtual clock calls it after each submit to plan the
    /// same on every runtime; a live engine has no need to.
    pub async fn settle_lookups(&self) -> Result<(), KvError> {
        self.run(Call::SettleLookups).await?.done()
    }

    /// Builds the next execution plan.
    pub async fn next_plan(&self) -> Result<ExecutionPlan, KvError> {
        self.run(Call::NextPlan).await?.plan()
    }

    /// Applies engine events in order. Refused ones come back in [`KvError::Batch`].
    pub async fn advance(&self, events: Vec<EngineEvent>) -> Result<(), KvError> {
        self.run(Call::Advance(events)).await?.done()
    }

    /// Aborts one request, whatever its state.
    pub async fn abort(&self, id: RequestId) -> Result<(), KvError> {
        self.run(Call::Abort(id)).await?.done()
    }

    /// Counters and gauges of every actor.
    pub async fn stats(&self) -> Result<SystemStats, KvError> {
        self.run(Call::Stats).await?.stats()
    }

    /// KV-cache events collected since the last call.
    pub async fn take_kv_events(&self) -> Result<Vec<KvEvent>, KvError> {
        self.run(Call::TakeKvEvents).await?.kv_events()
    }

    /// Runs a plan's copies on the device actor, then its forward rows through the
    /// device's model runner, and its L3 prefetches and backups on the L3 actor at the
    /// same time; returns the events to `advance` with (the device's, then the L3
    /// actor's). `new_requests` announces the requests submitted since the last plan to
    /// the runner. The plan moves to the actors: read what you need of it first.
    pub async fn execute(
        &self,
        plan: ExecutionPlan,
        new_requests: Vec<NewRequest>,
    ) -> Result<Vec<EngineEvent>, KvError> {
        self.run(Call::Execute(Box::new(plan), new_requests))
            .await?
            .events()
    }

    /// Takes the device core out of the system (to read its model runner at the end of
    /// a run). The system then has no device: `execute` without an L3 actor answers
    /// [`KvError::NoDevice`].
    pub async fn take_device(&self) -> Result<Option<DeviceCore>, KvError> {
        self.take_core::<DeviceCore>().await
    }

    /// Takes an actor's core out of the system; `None` when the system has no such
    /// actor. The system then has no such actor: `ask` answers [`KvError::NoActor`].
    pub async fn take_core<C: ActorCore>(&self) -> Result<Option<C>, KvError> {
        self.run(Call::TakeCore(C::NAME)).await?.core::<C>()
    }

    /// Sends one message of an actor's own protocol (an actor added with
    /// [`crate::SystemBuilder::actor`]) and waits for its reply.
    pub async fn ask<C: ActorCore>(&self, msg: C::Msg) -> Result<C::Reply, KvError> {
        self.run(Call::ask::<C>(msg)).await?.reply::<C>()
    }

    /// Drains what is in flight, stops the actors and reports anything still held.
    /// Later calls on any clone fail with [`KvError::ShutDown`].
    pub async fn shutdown(&self) -> Result<ShutdownReport, KvError> {
        self.run(Call::Shutdown).await?.report()
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

    /// See [`Handle::settle_lookups`].
    pub fn settle_lookups(&self) -> Result<(), KvError> {
        block_on(self.handle.settle_lookups())
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
        plan: ExecutionPlan,
        new_requests: Vec<NewRequest>,
    ) -> Result<Vec<EngineEvent>, KvError> {
        block_on(self.handle.execute(plan, new_requests))
    }

    /// See [`Handle::take_device`].
    pub fn take_device(&self) -> Result<Option<DeviceCore>, KvError> {
        block_on(self.handle.take_device())
    }

    /// See [`Handle::take_core`].
    pub fn take_core<C: ActorCore>(&self) -> Result<Option<C>, KvError> {
        block_on(self.handle.take_core::<C>())
    }

    /// See [`Handle::ask`].
    pub fn ask<C: ActorCore>(&self, msg: C::Msg) -> Result<C::Reply, KvError> {
        block_on(self.handle.ask::<C>(msg))
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
