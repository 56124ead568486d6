//! The deterministic runtime: the same cores and the same mail as actix, delivered one
//! at a time by a single-threaded bus in a fixed order. Answers travel back as
//! deliveries too, so fault hooks may delay, reorder or fail either.
//!
//! An L3 lookup belongs to no call: it waits in the queue with its ticket, outlives the
//! call that sent it, and is delivered whenever the bus runs; what is due when a call
//! opens goes first, so undelayed lookups answer before the next call as on the direct
//! path, and a delayed one lets calls go on without it.

use std::collections::VecDeque;

use kvtier_types::ActorName;

use super::{Driver, feed};
use crate::KvError;
use crate::conversation::{Call, Conversation, Front, Outcome, Step};
use crate::faults::{Delivery, Post};
use crate::mail::{Answer, Destinations, Mail};

#[derive(Debug)]
enum Payload {
    Mail(Mail),
    Answer(Answer),
}

#[derive(Debug)]
struct Envelope {
    delivery: Delivery,
    due: u64,
    payload: Payload,
    /// An L3 lookup or its answer (no call's mail).
    lookup: Option<u64>,
}

/// The bus and the cores it delivers to.
#[derive(Debug)]
pub(crate) struct Bus {
    front: Front,
    actors: Destinations,
    post: Post,
    queue: VecDeque<Envelope>,
    clock: u64,
}

impl Bus {
    pub fn new(front: Front, actors: Destinations, post: Post) -> Self {
        Self {
            front,
            actors,
            post,
            queue: VecDeque::new(),
            clock: 0,
        }
    }

    fn post(
        &mut self,
        from: ActorName,
        to: ActorName,
        payload: Payload,
        lookup: Option<u64>,
    ) -> Result<(), KvError> {
        let name = match &payload {
            Payload::Mail(mail) => mail.name,
            Payload::Answer(answer) => answer.name,
        };
        // A failed delivery drops the payload here: any handle in it goes home.
        let (delivery, delay) = self.post.send(from, to, name)?;
        self.queue.push_back(Envelope {
            delivery,
            due: self.clock + delay,
            payload,
            lookup,
        });
        Ok(())
    }

    /// Queues the lookups the last call left.
    fn post_lookups(&mut self) {
        for (ticket, mail) in self.front.take_detached() {
            let to = mail.to;
            if let Err(error) =
                self.post(ActorName::SCHEDULER, to, Payload::Mail(mail), Some(ticket))
            {
                self.front.arrived(ticket, Err(error));
            }
        }
    }

    /// Delivers a lookup or hands its answer back.
    fn deliver_lookup(&mut self, ticket: u64, payload: Payload) {
        match payload {
            // Its hook ran when it was posted.
            Payload::Answer(answer) => self.front.arrived(ticket, Ok(answer)),
            Payload::Mail(mail) => {
                let to = mail.to;
                let posted = self.deliver(mail).and_then(|answer| {
                    self.post(
                        to,
                        ActorName::SCHEDULER,
                        Payload::Answer(answer),
                        Some(ticket),
                    )
                });
                if let Err(error) = posted {
                    self.front.arrived(ticket, Err(error));
                }
            }
        }
    }

    fn deliver(&mut self, mail: Mail) -> Result<Answer, KvError> {
        let to = mail.to;
        match self.actors.get_mut(&to) {
            Some(actor) => actor.deliver(mail),
            None => Err(KvError::ActorGone(to)),
        }
    }

    /// Runs the lookups due now (before a call opens), or all of them (`settle`).
    fn run_lookups(&mut self, settle: bool) {
        while self.queue.iter().any(|e| settle || e.due <= self.clock) {
            let Some(envelope) = self.next() else { break };
            match envelope.lookup {
                Some(ticket) => self.deliver_lookup(ticket, envelope.payload),
                None => debug_assert!(false, "a call's mail outlived it"),
            }
        }
    }

    /// Drops what a call left queued but the lookups.
    fn drop_call_mail(&mut self) {
        self.queue.retain(|e| e.lookup.is_some());
    }

    /// The next envelope: the earliest due, and among the ready ones the hooks' pick.
    fn next(&mut self) -> Option<Envelope> {
        let earliest = self.queue.iter().map(|e| e.due).min()?;
        self.clock = self.clock.max(earliest);
        let ready: Vec<usize> = (0..self.queue.len())
            .filter(|&i| self.queue[i].due <= self.clock)
            .collect();
        let deliveries: Vec<Delivery> = ready
            .iter()
            .map(|&i| self.queue[i].delivery.clone())
            .collect();
        let pick = self.post.pick(&deliveries).min(ready.len() - 1);
        self.clock += 1;
        self.queue.remove(ready[pick])
    }

    /// Runs the queue until the conversation takes another step.
    fn wait(&mut self, conv: &mut Conversation) -> Step {
        loop {
            let Some(envelope) = self.next() else {
                return self
                    .front
                    .fault(conv, crate::conversation::nothing_to_wait_for());
            };
            if let Some(ticket) = envelope.lookup {
                self.deliver_lookup(ticket, envelope.payload);
                continue;
            }
            match envelope.payload {
                Payload::Answer(answer) => {
                    // Its hook ran when it was posted.
                    let step = self.front.answer(conv, answer);
                    if !matches!(step, Step::Wait) {
                        return step;
                    }
                }
                Payload::Mail(mail) => {
                    let to = mail.to;
                    let posted = self.deliver(mail).and_then(|answer| {
                        self.post(to, ActorName::SCHEDULER, Payload::Answer(answer), None)
                    });
                    if let Err(error) = posted {
                        return feed(&mut self.front, &mut self.post, conv, vec![Err(error)]);
                    }
                }
            }
        }
    }
}

impl Driver for Bus {
    fn call(&mut self, call: Call, span: tracing::Span) -> Result<Outcome, KvError> {
        let settle = matches!(call, Call::SettleLookups);
        self.run_lookups(settle);
        let (mut conv, mut step) = self.front.open(call, span);
        self.post_lookups();
        loop {
            step = match step {
                Step::Done(result) => {
                    // Whatever a broken-off conversation left queued is dropped.
                    self.drop_call_mail();
                    return result;
                }
                Step::Send(mail) => {
                    let mut failed = None;
                    for one in mail {
                        if let Err(error) =
                            self.post(ActorName::SCHEDULER, one.to, Payload::Mail(one), None)
                        {
                            failed = Some(error);
                            break;
                        }
                    }
                    match failed {
                        Some(error) => {
                            self.drop_call_mail();
                            self.front.fault(&mut conv, error)
                        }
                        None => self.wait(&mut conv),
                    }
                }
                Step::Wait => self.wait(&mut conv),
            };
        }
    }
}
