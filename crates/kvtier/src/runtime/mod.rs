//! The runtimes: each moves the conversation's mail to the actors and their answers
//! back. None decides anything: every decision is in the cores and in
//! [`crate::conversation`].
//!
//! * [`direct`]: the cores called in place, in order, on the caller's thread.
//! * [`bus`]: the deterministic bus; fault hooks may delay, reorder or fail deliveries.
//! * [`actix`]: one generic shell per actor on actix arbiters.

pub(crate) mod actix;
pub(crate) mod bus;
pub(crate) mod direct;

use kvtier_types::ActorName;

use crate::KvError;
use crate::conversation::{Call, Conversation, Front, Outcome, Step};
use crate::faults::Post;
use crate::mail::Answer;

/// Runs calls to completion on the thread that owns the system.
pub(crate) trait Driver: std::fmt::Debug {
    fn call(&mut self, call: Call, span: tracing::Span) -> Result<Outcome, KvError>;
}

/// Hands the answers to a conversation's mail over, in sending order, each through the
/// fault hooks on its way back.
pub(crate) fn feed(
    front: &mut Front,
    post: &mut Post,
    conv: &mut Conversation,
    answers: Vec<Result<Answer, KvError>>,
) -> Step {
    let mut step = Step::Wait;
    for answer in answers {
        let answer = answer.and_then(|a| {
            post.send(a.from, ActorName::SCHEDULER, a.name)?;
            Ok(a)
        });
        step = match answer {
            Ok(answer) => front.answer(conv, answer),
            Err(error) => front.fault(conv, error),
        };
        if !matches!(step, Step::Wait) {
            // Done or more mail: any later answer belongs to nothing and is dropped.
            break;
        }
    }
    step
}
