//! The actix runtime: one actor per core, on one arbiter (local delivery, no thread hop
//! between actors). Each shell owns its core and maps messages to core calls.

use actix::prelude::*;
use kvtier_device::DeviceCore;
use kvtier_fsm::{Progress, SchedulerCore};
use kvtier_host::HostAllocator;
use kvtier_l3::L3Core;
use kvtier_radix::{CacheBatch, RadixCache};
use kvtier_types::{EngineEvent, ExecutionPlan};

use crate::messages::*;
use crate::{KvError, Parts};

// ----- Host allocator --------------------------------------------------------------

/// The Host allocator actor.
#[derive(Debug)]
pub struct HostActor {
    core: HostAllocator,
}

impl Actor for HostActor {
    type Context = Context<Self>;
}

impl Handler<Lease> for HostActor {
    type Result = <Lease as actix::Message>::Result;
    fn handle(&mut self, msg: Lease, _: &mut Context<Self>) -> Self::Result {
        self.core.lease(msg.pages)
    }
}

impl Handler<HostStatsQuery> for HostActor {
    type Result = MessageResult<HostStatsQuery>;
    fn handle(&mut self, _: HostStatsQuery, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.core.stats())
    }
}

// ----- Radix cache -----------------------------------------------------------------

/// The Radix cache actor. The cache is dropped at shutdown, returning its host lease.
#[derive(Debug)]
pub struct RadixActor {
    cache: Option<RadixCache>,
}

impl Actor for RadixActor {
    type Context = Context<Self>;
}

impl Handler<RunBatch> for RadixActor {
    type Result = MessageResult<RunBatch>;
    fn handle(&mut self, msg: RunBatch, _: &mut Context<Self>) -> Self::Result {
        let _entered = msg.span.enter();
        let reply = match &mut self.cache {
            Some(cache) => cache.execute(msg.batch),
            // Closed: the batch's handles are dropped; the scheduler sees a short reply.
            None => Default::default(),
        };
        MessageResult(reply)
    }
}

impl Handler<CacheStats> for RadixActor {
    type Result = MessageResult<CacheStats>;
    fn handle(&mut self, _: CacheStats, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.cache.as_mut().map(|c| c.stats()).unwrap_or_default())
    }
}

impl Handler<DrainKvEvents> for RadixActor {
    type Result = MessageResult<DrainKvEvents>;
    fn handle(&mut self, _: DrainKvEvents, _: &mut Context<Self>) -> Self::Result {
        MessageResult(
            self.cache
                .as_mut()
                .map(|c| c.drain_events())
                .unwrap_or_default(),
        )
    }
}

impl Handler<CheckPages> for RadixActor {
    type Result = MessageResult<CheckPages>;
    fn handle(&mut self, msg: CheckPages, _: &mut Context<Self>) -> Self::Result {
        let [device, host] = &msg.outside;
        MessageResult(match &mut self.cache {
            Some(cache) => cache.check_invariants([device, host]),
            None => Err("the cache is closed".into()),
        })
    }
}

impl Handler<CloseCache> for RadixActor {
    type Result = ();
    fn handle(&mut self, _: CloseCache, _: &mut Context<Self>) {
        self.cache = None;
    }
}

// ----- Device ----------------------------------------------------------------------

/// The Device actor: arenas, kernel library, model runner. On its own arbiter when the
/// system has its own thread, so copies never block the scheduler.
#[derive(Debug)]
pub struct DeviceActor {
    core: Option<DeviceCore>,
}

impl Actor for DeviceActor {
    type Context = Context<Self>;
}

impl Handler<Execute> for DeviceActor {
    type Result = <Execute as actix::Message>::Result;
    fn handle(&mut self, msg: Execute, _: &mut Context<Self>) -> Self::Result {
        let _entered = msg.span.enter();
        let core = self.core.as_mut().ok_or(KvError::NoDevice)?;
        Ok(core.execute(&msg.plan, &msg.new_requests)?)
    }
}

impl Handler<TakeDevice> for DeviceActor {
    type Result = MessageResult<TakeDevice>;
    fn handle(&mut self, _: TakeDevice, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.core.take())
    }
}

impl Handler<DeviceStatsQuery> for DeviceActor {
    type Result = MessageResult<DeviceStatsQuery>;
    fn handle(&mut self, _: DeviceStatsQuery, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.core.as_ref().map(DeviceCore::stats))
    }
}

// ----- L3 store --------------------------------------------------------------------

/// The L3 store actor: backend, key namespace, the host arena it shares with the
/// device. Always on an arbiter (thread) of its own: its backend calls block.
#[derive(Debug)]
pub struct L3Actor {
    core: L3Core,
}

impl Actor for L3Actor {
    type Context = Context<Self>;
}

impl L3Actor {
    /// The actor over `core`, not started.
    pub(crate) fn new(core: L3Core) -> Self {
        Self { core }
    }
}

impl Handler<L3Lookup> for L3Actor {
    type Result = MessageResult<L3Lookup>;
    fn handle(&mut self, mut msg: L3Lookup, _: &mut Context<Self>) -> Self::Result {
        let _entered = msg.span.enter();
        self.core.lookup(&mut msg.specs, msg.threshold);
        MessageResult(msg.specs)
    }
}

impl Handler<L3Transfer> for L3Actor {
    type Result = MessageResult<L3Transfer>;
    fn handle(&mut self, msg: L3Transfer, _: &mut Context<Self>) -> Self::Result {
        let _entered = msg.span.enter();
        MessageResult(self.core.transfer(&msg.prefetches, &msg.backups))
    }
}

impl Handler<L3StatsQuery> for L3Actor {
    type Result = MessageResult<L3StatsQuery>;
    fn handle(&mut self, _: L3StatsQuery, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.core.stats())
    }
}

// ----- Scheduler -------------------------------------------------------------------

/// The Scheduler actor: the request FSM. Calls that need the cache converse with the
/// radix actor inside an atomic response, so no other message interleaves.
#[derive(Debug)]
pub struct SchedulerActor {
    core: Option<SchedulerCore>,
    radix: Addr<RadixActor>,
    host: Addr<HostActor>,
    device: Option<Addr<DeviceActor>>,
    l3: Option<Addr<L3Actor>>,
    /// Set when a conversation broke off: only shutdown is served then.
    failed: Option<String>,
}

impl Actor for SchedulerActor {
    type Context = Context<Self>;
}

type Reply<T> = AtomicResponse<SchedulerActor, Result<T, KvError>>;

fn ready<T: 'static>(value: Result<T, KvError>) -> Reply<T> {
    AtomicResponse::new(Box::pin(fut::ready(value)))
}

impl SchedulerActor {
    fn core(&mut self) -> Result<&mut SchedulerCore, KvError> {
        if let Some(reason) = &self.failed {
            return Err(KvError::Failed(reason.clone()));
        }
        self.core.as_mut().ok_or(KvError::ShutDown)
    }

    /// Sends a batch and resumes the core with the reply until it is done.
    fn converse(
        &mut self,
        batch: CacheBatch,
        span: tracing::Span,
    ) -> ResponseActFuture<Self, Result<Option<ExecutionPlan>, KvError>> {
        let request = self.radix.send(RunBatch {
            batch,
            span: span.clone(),
        });
        Box::pin(request.into_actor(self).then(move |reply, act, _| {
            let entered = span.enter();
            let resumed = match (reply, act.core()) {
                (Ok(reply), Ok(core)) => core.resume(reply).map_err(KvError::from),
                (Err(_), _) => Err(KvError::ActorGone("radix")),
                (_, Err(e)) => Err(e),
            };
            drop(entered);
            let next: ResponseActFuture<Self, _> = match resumed {
                Ok(Progress::Done) => Box::pin(fut::ready(Ok(None))),
                Ok(Progress::Plan(plan)) => Box::pin(fut::ready(Ok(Some(plan)))),
                Ok(Progress::Cache(batch)) => act.converse(batch, span),
                Err(e) => {
                    act.failed = Some(e.to_string());
                    Box::pin(fut::ready(Err(e)))
                }
            };
            next
        }))
    }

    /// Runs the core's queued cache work, then answers `result`.
    fn flush(&mut self, result: Result<(), KvError>, span: tracing::Span) -> Reply<()> {
        let batch = match self.core() {
            Ok(core) => core.take_batch(),
            Err(e) => return ready(Err(e)),
        };
        let Some(batch) = batch else {
            return ready(result);
        };
        AtomicResponse::new(Box::pin(
            self.converse(batch, span)
                .map(move |done, _, _| done.and(result)),
        ))
    }
}

impl Handler<Submit> for SchedulerActor {
    type Result = Reply<()>;
    fn handle(&mut self, msg: Submit, _: &mut Context<Self>) -> Self::Result {
        let (lookup, threshold) = match self.core() {
            Ok(core) => (
                core.config().l3_prefetch_enabled(),
                core.config().prefetch_threshold,
            ),
            Err(e) => return ready(Err(e)),
        };
        let l3 = self.l3.as_ref().filter(|_| lookup);
        let Some(l3) = l3 else {
            let _entered = msg.span.enter();
            return ready(self.core().and_then(|c| Ok(c.submit(msg.specs)?)));
        };
        // The prompts are looked up in L3 first (off this thread), then queued.
        let span = msg.span;
        let lookup = l3.send(L3Lookup {
            specs: msg.specs,
            threshold,
            span: span.clone(),
        });
        AtomicResponse::new(Box::pin(lookup.into_actor(self).map(
            move |specs, act, _| {
                let specs = specs.map_err(|_| KvError::ActorGone("l3"))?;
                let _entered = span.enter();
                Ok(act.core()?.submit(specs)?)
            },
        )))
    }
}

impl Handler<Advance> for SchedulerActor {
    type Result = Reply<()>;
    fn handle(&mut self, msg: Advance, _: &mut Context<Self>) -> Self::Result {
        let result = {
            let _entered = msg.span.enter();
            match self.core() {
                Ok(core) => core.advance(msg.events).map_err(KvError::from),
                Err(e) => return ready(Err(e)),
            }
        };
        self.flush(result, msg.span)
    }
}

impl Handler<Abort> for SchedulerActor {
    type Result = Reply<()>;
    fn handle(&mut self, msg: Abort, _: &mut Context<Self>) -> Self::Result {
        let result = match self.core() {
            Ok(core) => core.abort(&msg.id).map_err(KvError::from),
            Err(e) => return ready(Err(e)),
        };
        self.flush(result, msg.span)
    }
}

impl Handler<NextPlan> for SchedulerActor {
    type Result = Reply<ExecutionPlan>;
    fn handle(&mut self, msg: NextPlan, _: &mut Context<Self>) -> Self::Result {
        let entered = msg.span.enter();
        let planned = self.core().and_then(|c| c.plan().map_err(KvError::from));
        drop(entered);
        let batch = match planned {
            Ok(batch) => batch,
            Err(e) => return ready(Err(e)),
        };
        AtomicResponse::new(Box::pin(self.converse(batch, msg.span).map(
            |plan, _, _| {
                plan.and_then(|p| p.ok_or(KvError::Sched(kvtier_fsm::SchedError::UnexpectedReply)))
            },
        )))
    }
}

impl Handler<Stats> for SchedulerActor {
    type Result = Reply<SystemStats>;
    fn handle(&mut self, _: Stats, _: &mut Context<Self>) -> Self::Result {
        let core = match self.core() {
            Ok(core) => core.stats(),
            Err(e) => return ready(Err(e)),
        };
        let tree = self.radix.send(CacheStats);
        let host = self.host.send(HostStatsQuery);
        let device = self.device.as_ref().map(|d| d.send(DeviceStatsQuery));
        let l3 = self.l3.as_ref().map(|l3| l3.send(L3StatsQuery));
        let all = async move {
            let device = match device {
                Some(d) => d.await.ok().flatten(),
                None => None,
            };
            let l3 = match l3 {
                Some(l3) => l3.await.ok(),
                None => None,
            };
            (tree.await, host.await, device, l3)
        };
        AtomicResponse::new(Box::pin(all.into_actor(self).map(
            move |(tree, host, device, l3), _, _| {
                let tree = tree.map_err(|_| KvError::ActorGone("radix"))?;
                let host = host.map_err(|_| KvError::ActorGone("host"))?;
                Ok(SystemStats {
                    scheduler: core.with_tree(tree),
                    host,
                    device,
                    l3,
                })
            },
        )))
    }
}

impl Handler<TakeKvEvents> for SchedulerActor {
    type Result = Reply<Vec<kvtier_types::KvEvent>>;
    fn handle(&mut self, _: TakeKvEvents, _: &mut Context<Self>) -> Self::Result {
        if let Err(e) = self.core() {
            return ready(Err(e));
        }
        let events = self.radix.send(DrainKvEvents);
        AtomicResponse::new(Box::pin(
            events
                .into_actor(self)
                .map(|events, _, _| events.map_err(|_| KvError::ActorGone("radix"))),
        ))
    }
}

impl Handler<Shutdown> for SchedulerActor {
    type Result = AtomicResponse<Self, ShutdownReport>;
    fn handle(&mut self, _: Shutdown, _: &mut Context<Self>) -> Self::Result {
        let mut report = self.core.as_ref().map(core_report).unwrap_or_default();
        report.failure = self.failed.clone();
        // Dropping the core releases every handle it held back to its owner.
        self.core = None;
        let radix = self.radix.clone();
        let host = self.host.clone();
        let steps = async move {
            let conservation = radix
                .send(CheckPages {
                    outside: [Vec::new(), Vec::new()],
                })
                .await
                .unwrap_or_else(|_| Err("the radix actor is gone".into()));
            let _ = radix.send(CloseCache).await;
            let host = host.send(HostStatsQuery).await.unwrap_or_default();
            (conservation, host)
        };
        AtomicResponse::new(Box::pin(steps.into_actor(self).map(
            move |(conservation, host), _, _| {
                report.conservation = conservation;
                report.host = host;
                System::current().stop();
                report
            },
        )))
    }
}

/// The addresses the embedder talks to.
#[derive(Debug, Clone)]
pub(crate) struct Addrs {
    pub scheduler: Addr<SchedulerActor>,
    pub device: Option<Addr<DeviceActor>>,
    pub l3: Option<Addr<L3Actor>>,
}

/// Runs a plan on the device and L3 actors at once (their host pages are disjoint: the
/// scheduler pins them): the device's events first (write-back acks, then the runner's),
/// then the L3 actor's (`PrefetchDone`, then `BackupDone`).
pub(crate) async fn execute(
    addrs: &Addrs,
    plan: ExecutionPlan,
    new_requests: Vec<kvtier_device::NewRequest>,
    span: tracing::Span,
) -> Result<Vec<EngineEvent>, KvError> {
    if addrs.device.is_none() && addrs.l3.is_none() {
        return Err(KvError::NoDevice);
    }
    let l3 = addrs
        .l3
        .as_ref()
        .filter(|_| !plan.prefetches.is_empty() || !plan.backups.is_empty())
        .map(|l3| {
            l3.send(L3Transfer {
                prefetches: plan.prefetches.clone(),
                backups: plan.backups.clone(),
                span: span.clone(),
            })
        });
    let device = addrs.device.as_ref().map(|device| {
        device.send(Execute {
            plan,
            new_requests,
            span,
        })
    });
    let mut events = match device {
        Some(device) => device.await.map_err(|_| KvError::ShutDown)??,
        None => Vec::new(),
    };
    if let Some(l3) = l3 {
        events.extend(l3.await.map_err(|_| KvError::ActorGone("l3"))?);
    }
    Ok(events)
}

/// Starts the actors on the current actix system. The device actor gets its own arbiter
/// (thread) when `device_thread` is set; the L3 actor always gets one.
pub(crate) fn start(parts: Parts, device_thread: bool) -> Addrs {
    let Parts {
        core,
        cache,
        host,
        device,
        l3,
    } = parts;
    let host = HostActor { core: host }.start();
    let radix = RadixActor { cache: Some(cache) }.start();
    let device = device.map(|core| {
        let actor = DeviceActor { core: Some(core) };
        if device_thread {
            DeviceActor::start_in_arbiter(&Arbiter::new().handle(), move |_| actor)
        } else {
            actor.start()
        }
    });
    let l3 = l3
        .map(|core| L3Actor::start_in_arbiter(&Arbiter::new().handle(), move |_| L3Actor { core }));
    let scheduler = SchedulerActor {
        core: Some(core),
        radix,
        host,
        device: device.clone(),
        l3: l3.clone(),
        failed: None,
    }
    .start();
    Addrs {
        scheduler,
        device,
        l3,
    }
}
