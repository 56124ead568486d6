//! The direct path: each mail is handled in place, in sending order, on the caller's
//! thread. No queue, no thread: the cheapest way to run the actors' cores together. An
//! L3 lookup is answered in place too, right after the submit that sent it.

use kvtier_types::ActorName;

use super::{Driver, feed};
use crate::KvError;
use crate::conversation::{Call, Front, Outcome, Step};
use crate::faults::Post;
use crate::mail::{Answer, Destinations, Mail};

#[derive(Debug)]
pub(crate) struct Direct {
    front: Front,
    actors: Destinations,
    post: Post,
}

impl Direct {
    pub fn new(front: Front, actors: Destinations, post: Post) -> Self {
        Self {
            front,
            actors,
            post,
        }
    }

    fn deliver(&mut self, mail: Mail) -> Result<Answer, KvError> {
        self.post.send(ActorName::SCHEDULER, mail.to, mail.name)?;
        let actor = self
            .actors
            .get_mut(&mail.to)
            .ok_or(KvError::ActorGone(mail.to))?;
        actor.deliver(mail)
    }

    /// Delivers the lookups the last call left, and hands their answers back.
    fn lookups(&mut self) {
        for (ticket, mail) in self.front.take_detached() {
            let answer = self.deliver(mail).and_then(|a| {
                self.post.send(a.from, ActorName::SCHEDULER, a.name)?;
                Ok(a)
            });
            self.front.arrived(ticket, answer);
        }
    }
}

impl Driver for Direct {
    fn call(&mut self, call: Call, span: tracing::Span) -> Result<Outcome, KvError> {
        let (mut conv, mut step) = self.front.open(call, span);
        self.lookups();
        loop {
            step = match step {
                Step::Done(result) => return result,
                Step::Send(mail) => {
                    let mut answers = Vec::with_capacity(mail.len());
                    for one in mail {
                        let answer = self.deliver(one);
                        let failed = answer.is_err();
                        answers.push(answer);
                        if failed {
                            // The rest is never delivered, as on the bus.
                            break;
                        }
                    }
                    feed(&mut self.front, &mut self.post, &mut conv, answers)
                }
                // Every answer was handed over: nothing is left to wait for.
                Step::Wait => self
                    .front
                    .fault(&mut conv, crate::conversation::nothing_to_wait_for()),
            };
        }
    }
}
