//! The deterministic runtime: the same cores and the same messages as the actix
//! runtime, delivered one at a time by a single-threaded bus in a fixed order.
//!
//! Fault hooks see every delivery and may deliver it, delay it by some ticks, or fail
//! it; when several messages are ready at once, a hook picks which goes first.

use std::collections::VecDeque;

use kvtier_device::{DeviceCore, DeviceError, NewRequest};
use kvtier_fsm::{Progress, SchedulerCore};
use kvtier_host::{HostAllocator, HostStats};
use kvtier_l3::L3Core;
use kvtier_radix::{CacheBatch, CacheReply, RadixCache, TreeStats};
use kvtier_types::{
    BackupOp, EngineEvent, ExecutionPlan, KvEvent, PrefetchOp, RequestId, RequestSpec,
};

use crate::messages::{ShutdownReport, SystemStats, core_report};
use crate::{KvError, Parts};

/// An actor of the system, for fault hooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ActorName {
    /// The request FSM.
    Scheduler,
    /// The radix cache.
    Radix,
    /// The host allocator.
    Host,
    /// The device (arenas, kernels, model runner).
    Device,
    /// The L3 store.
    L3,
    /// The embedder's engine loop (sender of `Execute`).
    Engine,
}

impl ActorName {
    fn name(self) -> &'static str {
        match self {
            ActorName::Scheduler => "scheduler",
            ActorName::Radix => "radix",
            ActorName::Host => "host",
            ActorName::Device => "device",
            ActorName::L3 => "l3",
            ActorName::Engine => "engine",
        }
    }
}

/// A message about to be delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Sequence number of the message on the bus (from 0).
    pub seq: u64,
    /// The sender.
    pub from: ActorName,
    /// The receiver.
    pub to: ActorName,
    /// The message type (as in `docs/messages.md`).
    pub message: &'static str,
}

/// What to do with a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Deliver it now.
    Deliver,
    /// Hold it back this many ticks (other ready messages go first).
    Delay(u64),
    /// Drop it: the call it belongs to fails with [`KvError::DeliveryFailed`].
    Fail,
}

/// Fault injection for the deterministic runtime. The defaults deliver everything in
/// sending order.
pub trait FaultHooks: Send + std::fmt::Debug {
    /// Called once per message when it is sent.
    fn on_send(&mut self, _delivery: &Delivery) -> Fault {
        Fault::Deliver
    }

    /// Picks which of the ready messages (in sending order) is delivered next.
    fn pick(&mut self, _ready: &[Delivery]) -> usize {
        0
    }
}

/// Delivers everything in sending order.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoFaults;

impl FaultHooks for NoFaults {}

#[derive(Debug)]
enum Payload {
    Batch(CacheBatch),
    Reply(CacheReply),
    CacheStats,
    TreeStats(TreeStats),
    HostStatsQuery,
    HostStats(HostStats),
    Execute(Box<ExecutionPlan>, Vec<NewRequest>),
    Executed(Result<Vec<EngineEvent>, DeviceError>),
    Lookup(Vec<RequestSpec>, u32),
    LookedUp(Vec<RequestSpec>),
    Transfer(Vec<PrefetchOp>, Vec<BackupOp>),
    Transferred(Vec<EngineEvent>),
}

impl Payload {
    fn name(&self) -> &'static str {
        match self {
            Payload::Batch(_) => "RunBatch",
            Payload::Reply(_) => "CacheReply",
            Payload::CacheStats => "CacheStats",
            Payload::TreeStats(_) => "TreeStats",
            Payload::HostStatsQuery => "HostStatsQuery",
            Payload::HostStats(_) => "HostStats",
            Payload::Execute(..) => "Execute",
            Payload::Executed(_) => "Executed",
            Payload::Lookup(..) => "L3Lookup",
            Payload::LookedUp(_) => "L3LookedUp",
            Payload::Transfer(..) => "L3Transfer",
            Payload::Transferred(_) => "L3Transferred",
        }
    }
}

#[derive(Debug)]
struct Envelope {
    delivery: Delivery,
    due: u64,
    payload: Payload,
}

/// What the scheduler's side of a conversation is waiting for.
enum Wanted {
    Done,
    Plan(Option<Box<ExecutionPlan>>),
}

/// The bus and the cores it delivers to.
#[derive(Debug)]
pub struct Bus {
    scheduler: Option<SchedulerCore>,
    radix: Option<RadixCache>,
    host: HostAllocator,
    device: Option<DeviceCore>,
    l3: Option<L3Core>,
    hooks: Box<dyn FaultHooks>,
    queue: VecDeque<Envelope>,
    clock: u64,
    seq: u64,
    failed: Option<String>,
    /// Stats replies collected by the scheduler's side.
    stats_in: (Option<TreeStats>, Option<HostStats>),
    /// The device's answer to the engine's `Execute`.
    executed: Option<Result<Vec<EngineEvent>, DeviceError>>,
    /// The L3 actor's answers: looked-up specs, transfer events.
    looked_up: Option<Vec<RequestSpec>>,
    transferred: Option<Vec<EngineEvent>>,
}

impl Bus {
    pub(crate) fn new(parts: Parts, hooks: Box<dyn FaultHooks>) -> Self {
        Self {
            scheduler: Some(parts.core),
            radix: Some(parts.cache),
            host: parts.host,
            device: parts.device,
            l3: parts.l3,
            hooks,
            queue: VecDeque::new(),
            clock: 0,
            seq: 0,
            failed: None,
            stats_in: (None, None),
            executed: None,
            looked_up: None,
            transferred: None,
        }
    }

    fn core(&mut self) -> Result<&mut SchedulerCore, KvError> {
        if let Some(reason) = &self.failed {
            return Err(KvError::Failed(reason.clone()));
        }
        self.scheduler.as_mut().ok_or(KvError::ShutDown)
    }

    fn send(&mut self, from: ActorName, to: ActorName, payload: Payload) -> Result<(), KvError> {
        let delivery = Delivery {
            seq: self.seq,
            from,
            to,
            message: payload.name(),
        };
        self.seq += 1;
        let due = match self.hooks.on_send(&delivery) {
            Fault::Deliver => self.clock,
            Fault::Delay(ticks) => self.clock + ticks,
            Fault::Fail => {
                let error = KvError::DeliveryFailed {
                    to: to.name(),
                    message: delivery.message,
                };
                // The payload (and any handle in it) is dropped: handles go home.
                drop(payload);
                self.failed = Some(error.to_string());
                return Err(error);
            }
        };
        self.queue.push_back(Envelope {
            delivery,
            due,
            payload,
        });
        Ok(())
    }

    /// Delivers messages until the queue is empty; returns the plan if one completed.
    fn run(&mut self, mut wanted: Wanted) -> Result<Option<Box<ExecutionPlan>>, KvError> {
        while !self.queue.is_empty() {
            let earliest = self.queue.iter().map(|e| e.due).min().unwrap_or(self.clock);
            self.clock = self.clock.max(earliest);
            let ready: Vec<usize> = (0..self.queue.len())
                .filter(|&i| self.queue[i].due <= self.clock)
                .collect();
            let infos: Vec<Delivery> = ready
                .iter()
                .map(|&i| self.queue[i].delivery.clone())
                .collect();
            let pick = self.hooks.pick(&infos).min(ready.len() - 1);
            let envelope = self
                .queue
                .remove(ready[pick])
                .expect("picked from the ready messages");
            self.clock += 1;
            self.deliver(envelope, &mut wanted)?;
        }
        Ok(match wanted {
            Wanted::Plan(plan) => plan,
            Wanted::Done => None,
        })
    }

    fn deliver(&mut self, envelope: Envelope, wanted: &mut Wanted) -> Result<(), KvError> {
        use ActorName::*;
        match envelope.payload {
            Payload::Batch(batch) => {
                let reply = match &mut self.radix {
                    Some(cache) => cache.execute(batch),
                    None => CacheReply::default(),
                };
                self.send(Radix, Scheduler, Payload::Reply(reply))
            }
            Payload::Reply(reply) => match self.core()?.resume(reply)? {
                Progress::Done => Ok(()),
                Progress::Plan(plan) => {
                    *wanted = Wanted::Plan(Some(Box::new(plan)));
                    Ok(())
                }
                Progress::Cache(batch) => self.send(Scheduler, Radix, Payload::Batch(batch)),
            },
            Payload::CacheStats => {
                let stats = self.radix.as_mut().map(|c| c.stats()).unwrap_or_default();
                self.send(Radix, Scheduler, Payload::TreeStats(stats))
            }
            Payload::HostStatsQuery => {
                let stats = self.host.stats();
                self.send(Host, Scheduler, Payload::HostStats(stats))
            }
            Payload::TreeStats(stats) => {
                self.stats_in.0 = Some(stats);
                Ok(())
            }
            Payload::HostStats(stats) => {
                self.stats_in.1 = Some(stats);
                Ok(())
            }
            Payload::Execute(plan, new) => {
                let result = match &mut self.device {
                    Some(device) => device.execute(&plan, &new),
                    None => Ok(Vec::new()),
                };
                self.send(Device, Engine, Payload::Executed(result))
            }
            Payload::Executed(result) => {
                self.executed = Some(result);
                Ok(())
            }
            Payload::Lookup(mut specs, threshold) => {
                if let Some(l3) = &mut self.l3 {
                    l3.lookup(&mut specs, threshold);
                }
                self.send(L3, Scheduler, Payload::LookedUp(specs))
            }
            Payload::LookedUp(specs) => {
                self.looked_up = Some(specs);
                Ok(())
            }
            Payload::Transfer(prefetches, backups) => {
                let events = match &mut self.l3 {
                    Some(l3) => l3.transfer(&prefetches, &backups),
                    None => Vec::new(),
                };
                self.send(L3, Engine, Payload::Transferred(events))
            }
            Payload::Transferred(events) => {
                self.transferred = Some(events);
                Ok(())
            }
        }
    }

    /// A failed conversation fails the system: the core may be mid-call.
    fn guard<T>(&mut self, result: Result<T, KvError>) -> Result<T, KvError> {
        if let Err(e) = &result
            && self.failed.is_none()
            && !matches!(e, KvError::Batch(_) | KvError::Sched(_) | KvError::ShutDown)
        {
            self.failed = Some(e.to_string());
        }
        result
    }

    fn flush(&mut self) -> Result<(), KvError> {
        if let Some(batch) = self.core()?.take_batch() {
            self.send(
                ActorName::Scheduler,
                ActorName::Radix,
                Payload::Batch(batch),
            )?;
            let run = self.run(Wanted::Done);
            self.guard(run)?;
        }
        Ok(())
    }

    /// Queues requests, after looking their prompts up in L3 when the system has an L3
    /// actor and prefetching is on.
    pub fn submit(&mut self, specs: Vec<RequestSpec>) -> Result<(), KvError> {
        let config = self.core()?.config();
        let (lookup, threshold) = (config.l3_prefetch_enabled(), config.prefetch_threshold);
        if !lookup || self.l3.is_none() {
            return Ok(self.core()?.submit(specs)?);
        }
        self.send(
            ActorName::Scheduler,
            ActorName::L3,
            Payload::Lookup(specs, threshold),
        )?;
        let run = self.run(Wanted::Done);
        self.guard(run)?;
        match self.looked_up.take() {
            Some(specs) => Ok(self.core()?.submit(specs)?),
            None => Err(KvError::Sched(kvtier_fsm::SchedError::UnexpectedReply)),
        }
    }

    /// Applies engine events, then their cache work.
    pub fn advance(&mut self, events: Vec<EngineEvent>) -> Result<(), KvError> {
        let result = self.core()?.advance(events);
        self.flush()?;
        Ok(result?)
    }

    /// Aborts a request, then runs its cache work.
    pub fn abort(&mut self, id: &RequestId) -> Result<(), KvError> {
        let result = self.core()?.abort(id);
        self.flush()?;
        Ok(result?)
    }

    /// Builds the next plan.
    pub fn next_plan(&mut self) -> Result<ExecutionPlan, KvError> {
        let batch = self.core()?.plan()?;
        self.send(
            ActorName::Scheduler,
            ActorName::Radix,
            Payload::Batch(batch),
        )?;
        let plan = self.run(Wanted::Plan(None));
        let plan = self.guard(plan)?;
        plan.map(|p| *p)
            .ok_or(KvError::Sched(kvtier_fsm::SchedError::UnexpectedReply))
    }

    /// Counters of every actor (the radix and host queries travel concurrently).
    pub fn stats(&mut self) -> Result<SystemStats, KvError> {
        let core = self.core()?.stats();
        self.stats_in = (None, None);
        self.send(ActorName::Scheduler, ActorName::Radix, Payload::CacheStats)?;
        self.send(
            ActorName::Scheduler,
            ActorName::Host,
            Payload::HostStatsQuery,
        )?;
        self.run(Wanted::Done)?;
        match std::mem::take(&mut self.stats_in) {
            (Some(tree), Some(host)) => Ok(SystemStats {
                scheduler: core.with_tree(tree),
                host,
                device: self.device.as_ref().map(DeviceCore::stats),
                l3: self.l3.as_ref().map(L3Core::stats),
            }),
            _ => Err(KvError::Sched(kvtier_fsm::SchedError::UnexpectedReply)),
        }
    }

    /// Runs a plan on the device (its copies, then its forward rows) and on the L3
    /// actor (its prefetches and backups): the device's events, then the L3 actor's.
    pub fn execute(
        &mut self,
        plan: ExecutionPlan,
        new_requests: Vec<NewRequest>,
    ) -> Result<Vec<EngineEvent>, KvError> {
        if let Some(reason) = &self.failed {
            return Err(KvError::Failed(reason.clone()));
        }
        if self.device.is_none() && self.l3.is_none() {
            return Err(KvError::NoDevice);
        }
        let l3_work = self.l3.is_some() && !(plan.prefetches.is_empty() && plan.backups.is_empty());
        if l3_work {
            self.send(
                ActorName::Engine,
                ActorName::L3,
                Payload::Transfer(plan.prefetches.clone(), plan.backups.clone()),
            )?;
        }
        if self.device.is_some() {
            self.send(
                ActorName::Engine,
                ActorName::Device,
                Payload::Execute(Box::new(plan), new_requests),
            )?;
        }
        self.run(Wanted::Done)?;
        let mut events = match (self.device.is_some(), self.executed.take()) {
            (true, Some(result)) => result?,
            (false, _) => Vec::new(),
            (true, None) => return Err(KvError::Sched(kvtier_fsm::SchedError::UnexpectedReply)),
        };
        if l3_work {
            match self.transferred.take() {
                Some(l3_events) => events.extend(l3_events),
                None => return Err(KvError::Sched(kvtier_fsm::SchedError::UnexpectedReply)),
            }
        }
        Ok(events)
    }

    /// Takes the device core out.
    pub fn take_device(&mut self) -> Option<DeviceCore> {
        self.device.take()
    }

    /// KV-cache events since the last call.
    pub fn take_kv_events(&mut self) -> Result<Vec<KvEvent>, KvError> {
        if let Some(reason) = &self.failed {
            return Err(KvError::Failed(reason.clone()));
        }
        Ok(self
            .radix
            .as_mut()
            .map(|c| c.drain_events())
            .unwrap_or_default())
    }

    /// Drops every core in order and reports what was held.
    pub fn shutdown(&mut self) -> ShutdownReport {
        let mut report = self.scheduler.as_ref().map(core_report).unwrap_or_default();
        report.failure = self.failed.clone();
        self.queue.clear();
        self.scheduler = None;
        report.conservation = match &mut self.radix {
            Some(cache) => cache.check_invariants([&[], &[]]),
            None => Err("the cache is closed".into()),
        };
        self.radix = None;
        self.l3 = None;
        report.host = self.host.stats();
        report
    }
}
