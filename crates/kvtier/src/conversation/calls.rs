//! Each call's own steps: what it sends first, and what it makes of the answers.

use kvtier_device::{DeviceCore, DeviceMsg, DeviceReply, NewRequest};
use kvtier_fsm::{FamilyReply, Progress, SchedulerStats};
use kvtier_host::{HostCore, HostMsg, HostReply};
use kvtier_l3::{L3Core, L3Msg, L3Reply};
use kvtier_radix::{RadixCore, RadixMsg, RadixReply};
use kvtier_types::{ActorName, ExecutionPlan, RequestSpec};

use super::*;
use crate::mail::{Answer, Mail};
use crate::{KvError, ShutdownReport, SystemStats};

impl Front {
    /// Submits, and sends the L3 lookups of long prompts outside the call: their
    /// requests wait in the core while L3 looks them up.
    pub(super) fn submit(
        &mut self,
        conv: &mut Conversation,
        specs: Vec<RequestSpec>,
    ) -> Result<Step, KvError> {
        let lookup = self.core()?.config().l3_prefetch_enabled();
        if !(lookup && self.has(ActorName::L3)) {
            self.core()?.submit(specs)?;
            return Ok(self.finish(conv, Ok(Outcome::Done)));
        }
        // Long prompts wait in the core while L3 looks them up.
        let (ask, result) = self.core()?.submit_with_lookup(specs);
        if let Some(ask) = ask {
            let ticket = ask.ticket;
            let mail = Mail::to::<L3Core>(L3Msg::L3Lookup(ask), &conv.span);
            self.detached.push((ticket, mail));
            self.lookups_in_flight += 1;
        }
        result?;
        Ok(self.finish(conv, Ok(Outcome::Done)))
    }

    /// Asks every actor for its stats, the scheduler's own in hand.
    pub(super) fn stats(&mut self, conv: &mut Conversation) -> Result<Step, KvError> {
        let scheduler = self.core()?.stats();
        let mut mail = vec![
            Mail::to::<RadixCore>(RadixMsg::CacheStats, &conv.span),
            Mail::to::<HostCore>(HostMsg::HostStatsQuery, &conv.span),
        ];
        if self.has(ActorName::DEVICE) {
            mail.push(Mail::to::<DeviceCore>(
                DeviceMsg::DeviceStatsQuery,
                &conv.span,
            ));
        }
        if self.has(ActorName::L3) {
            mail.push(Mail::to::<L3Core>(L3Msg::L3StatsQuery, &conv.span));
        }
        Ok(self.send(conv, Stage::Stats(Box::new(scheduler)), mail))
    }

    /// Hands a plan's copies and rows to the device and its L3 ops to the L3 store.
    pub(super) fn execute(
        &mut self,
        conv: &mut Conversation,
        mut plan: Box<ExecutionPlan>,
        new_requests: Vec<NewRequest>,
    ) -> Result<Step, KvError> {
        self.alive()?;
        let (device, l3) = (self.has(ActorName::DEVICE), self.has(ActorName::L3));
        if !device && !l3 {
            return Err(KvError::NoDevice);
        }
        let mut mail = Vec::new();
        let l3_work = l3 && !(plan.prefetches.is_empty() && plan.backups.is_empty());
        if l3_work {
            // The L3 ops move to the L3 actor; the device keeps a copy of the
            // prefetches (rare and small), so its runner knows which host pages
            // L3 fills (the oracle engine's provenance).
            let prefetches = if device {
                plan.prefetches.clone()
            } else {
                std::mem::take(&mut plan.prefetches)
            };
            let transfer = L3Msg::L3Transfer {
                prefetches,
                backups: std::mem::take(&mut plan.backups),
            };
            mail.push(Mail::to::<L3Core>(transfer, &conv.span));
        }
        if device {
            let execute = DeviceMsg::Execute { plan, new_requests };
            mail.push(Mail::to::<DeviceCore>(execute, &conv.span));
        }
        Ok(self.send(conv, Stage::Execute, mail))
    }

    /// Takes an actor's core out of the system.
    pub(super) fn take_core(
        &mut self,
        conv: &mut Conversation,
        actor: ActorName,
    ) -> Result<Step, KvError> {
        self.alive()?;
        if !self.has(actor) {
            return Ok(self.finish(conv, Ok(Outcome::Absent)));
        }
        let mail = Mail::take_core(actor, &conv.span);
        Ok(self.send(conv, Stage::TakeCore(actor), vec![mail]))
    }

    /// Forwards an embedder's message to its actor.
    pub(super) fn ask(&mut self, conv: &mut Conversation, mail: Mail) -> Result<Step, KvError> {
        self.alive()?;
        if !self.has(mail.to) {
            return Err(KvError::NoActor(mail.to));
        }
        Ok(self.send(conv, Stage::Forward, vec![mail]))
    }

    /// Drops the core (its handles go home), then checks conservation.
    pub(super) fn shutdown(&mut self, conv: &mut Conversation) -> Result<Step, KvError> {
        if self.shut_down {
            return Err(KvError::ShutDown);
        }
        self.shut_down = true;
        let mut report = self
            .core
            .as_ref()
            .map(ShutdownReport::of_core)
            .unwrap_or_default();
        report.failure = self.failed.clone();
        // Dropping the core sends every handle it held home.
        self.core = None;
        let mail =
            Mail::to::<RadixCore>(RadixMsg::CheckPages([Vec::new(), Vec::new()]), &conv.span);
        let stage = Stage::Shutdown(Box::new(report), Closing::Check);
        Ok(self.send(conv, stage, vec![mail]))
    }

    /// The cache's replies to the core's family mail: the core resumes with each, and
    /// either is done, has a plan, or sends more.
    pub(super) fn family_answered(
        &mut self,
        conv: &mut Conversation,
        result: Result<(), KvError>,
        answers: impl Iterator<Item = Answer>,
    ) -> Result<Step, KvError> {
        let mut progress = None;
        for answer in answers {
            let error = unexpected(&answer);
            let RadixReply::CacheReply(reply) = answer.reply::<RadixCore>()? else {
                return Err(error);
            };
            progress = Some(
                self.core()?
                    .resume(FamilyReply::Radix(reply))
                    .map_err(|_| error)?,
            );
        }
        let outcome = match progress {
            Some(Progress::Done) => result.map(|()| Outcome::Done),
            Some(Progress::Plan(plan)) => Ok(Outcome::Plan(plan)),
            Some(Progress::Send(mail)) => {
                let mail = family_mail(mail, &conv.span);
                return Ok(self.send(conv, Stage::Family(result), mail));
            }
            None => return Err(nothing_to_wait_for()),
        };
        Ok(self.finish(conv, outcome))
    }

    /// One shutdown step's answers, then the next step: what it could not learn is in
    /// the report, and shutdown goes on.
    pub(super) fn shutdown_answered(
        &mut self,
        conv: &mut Conversation,
        mut report: Box<ShutdownReport>,
        closing: Closing,
        answers: impl Iterator<Item = Answer>,
    ) -> Step {
        for answer in answers {
            let error = unexpected(&answer);
            let understood = match (closing, answer.from) {
                (Closing::Check, ActorName::RADIX) => match answer.reply::<RadixCore>() {
                    Ok(RadixReply::Checked(result)) => {
                        report.conservation = result.map_err(KvError::Cache);
                        true
                    }
                    _ => false,
                },
                (Closing::Stop, _) => true,
                (Closing::Host, ActorName::HOST) => match answer.reply::<HostCore>() {
                    Ok(HostReply::HostStats(stats)) => {
                        report.host = stats;
                        true
                    }
                    _ => false,
                },
                _ => false,
            };
            // Shutdown goes on: what it could not learn is in the report.
            if !understood {
                report.failure.get_or_insert(error);
            }
        }
        self.close(conv, report, closing)
    }

    /// Shutdown's next step after `done`.
    pub(super) fn close(
        &mut self,
        conv: &mut Conversation,
        report: Box<ShutdownReport>,
        done: Closing,
    ) -> Step {
        let span = conv.span.clone();
        match done {
            Closing::Check => {
                let mail: Vec<Mail> = self
                    .actors
                    .iter()
                    .filter(|&&a| a != ActorName::HOST)
                    .map(|&a| Mail::stop(a, &span))
                    .collect();
                if mail.is_empty() {
                    // Every other core was taken out already.
                    return self.close(conv, report, Closing::Stop);
                }
                self.send(conv, Stage::Shutdown(report, Closing::Stop), mail)
            }
            Closing::Stop => {
                let mail = Mail::to::<HostCore>(HostMsg::HostStatsQuery, &span);
                self.send(conv, Stage::Shutdown(report, Closing::Host), vec![mail])
            }
            Closing::Host => self.finish(conv, Ok(Outcome::Report(report))),
        }
    }
}

/// Every actor's stats, with the scheduler's.
pub(super) fn stats_answered(
    scheduler: SchedulerStats,
    answers: impl Iterator<Item = Answer>,
) -> Result<Outcome, KvError> {
    let (mut tree, mut host, mut device, mut l3) = (None, None, None, None);
    for answer in answers {
        let error = unexpected(&answer);
        match answer.from {
            ActorName::RADIX => match answer.reply::<RadixCore>()? {
                RadixReply::TreeStats(stats) => tree = Some(stats),
                _ => return Err(error),
            },
            ActorName::HOST => match answer.reply::<HostCore>()? {
                HostReply::HostStats(stats) => host = Some(stats),
                _ => return Err(error),
            },
            ActorName::DEVICE => match answer.reply::<DeviceCore>()? {
                DeviceReply::DeviceStats(stats) => device = Some(stats),
                _ => return Err(error),
            },
            ActorName::L3 => match answer.reply::<L3Core>()? {
                L3Reply::L3Stats(stats) => l3 = Some(*stats),
                _ => return Err(error),
            },
            _ => return Err(error),
        }
    }
    let (Some(tree), Some(host)) = (tree, host) else {
        return Err(nothing_to_wait_for());
    };
    Ok(Outcome::Stats(Box::new(SystemStats {
        scheduler: scheduler.with_tree(tree),
        host,
        device,
        l3,
    })))
}

/// The device's events (write-back acks, then the runner's), then the L3 store's
/// (`PrefetchDone`, then `BackupDone`).
pub(super) fn executed(answers: impl Iterator<Item = Answer>) -> Result<Outcome, KvError> {
    let (mut events, mut l3_events, mut refused) = (Vec::new(), Vec::new(), None);
    for answer in answers {
        let error = unexpected(&answer);
        match answer.from {
            ActorName::DEVICE => match answer.reply::<DeviceCore>()? {
                DeviceReply::Executed(Ok(device)) => events = device,
                DeviceReply::Executed(Err(e)) => refused = Some(e.into()),
                _ => return Err(error),
            },
            ActorName::L3 => match answer.reply::<L3Core>()? {
                L3Reply::L3Transferred(l3) => l3_events = l3,
                _ => return Err(error),
            },
            _ => return Err(error),
        }
    }
    // The device's events first (write-back acks, then the runner's), then
    // the L3 store's (`PrefetchDone`, then `BackupDone`).
    events.extend(l3_events);
    match refused {
        Some(error) => Err(error),
        None => Ok(Outcome::Events(events)),
    }
}
