//! The deterministic runtime: the same cores and the same mail as actix, delivered one
//! at a time by a single-threaded bus in a fixed order. Answers travel back as
//! deliveries too, so fault hooks may delay, reorder or fail either.

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

    fn post(&mut self, from: ActorName, to: ActorName, payload: Payload) -> Result<(), KvError> {
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
        });
        Ok(())
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
                return self.front.fault(conv, super::nothing_to_wait_for());
            };
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
                    let answer = match self.actors.get_mut(&to) {
                        Some(actor) => actor.deliver(mail),
                        None => Err(KvError::ActorGone(to)),
                    };
                    let posted = answer.and_then(|answer| {
                        self.post(to, ActorName::SCHEDULER, Payload::Answer(answer))
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
        let (mut conv, mut step) = self.front.open(call, span);
        loop {
            step = match step {
                Step::Done(result) => {
                    // Whatever a broken-off conversation left queued is dropped.
                    self.queue.clear();
                    return result;
                }
                Step::Send(mail) => {
                    let mut failed = None;
                    for one in mail {
                        if let Err(error) =
                            self.post(ActorName::SCHEDULER, one.to, Payload::Mail(one))
                        {
                            failed = Some(error);
                            break;
                        }
                    }
                    match failed {
                        Some(error) => {
                            self.queue.clear();
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
