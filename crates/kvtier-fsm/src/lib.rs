//! Request state machine and scheduling step of kvtier.
//!
//! [`Scheduler`] is a plain synchronous core: `submit` requests, ask for the
//! [`ExecutionPlan`](kvtier_types::ExecutionPlan) of the next step with `next_plan`, and
//! feed the engine's results back with `advance`. It reproduces the reference
//! scheduler's decisions step for step (candidate order, token budget, chunked prefill,
//! prefill-first or mixed batches, retraction and resume, write-back and load-back), with
//! the reference's known bugs fixed; see `docs/scheduler.md`.
//!
//! Every resource a request holds (node locks, device pages, its request-pool slot) is
//! an RAII handle inside its state, so leaving a state by any path releases exactly what
//! that state held.

mod error;
mod idmap;
mod request;
mod scheduler;
mod slots;
mod step;

pub use error::{BatchError, Rejected, SchedError};
pub use request::StateKind;
pub use scheduler::{Scheduler, SchedulerStats};
