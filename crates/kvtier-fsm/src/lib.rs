//! Request state machine and scheduling step of kvtier.
//!
//! [`Scheduler`] is a plain synchronous core: `submit` requests, ask for the
//! [`ExecutionPlan`](kvtier_types::ExecutionPlan) of the next step with `next_plan`, and
//! feed the engine's results back with `advance`. It reproduces the reference
//! scheduler's decisions step for step (candidate order, token budget, chunked prefill,
//! prefill-first or mixed batches, retraction and resume, write-back and load-back), with
//! the reference's known bugs fixed; see `docs/scheduler.md`.
//!
//! ```
//! use kvtier_fsm::Scheduler;
//! use kvtier_types::{EngineEvent, RequestSpec, SchedulerConfig};
//!
//! let config = SchedulerConfig { page_size: 2, device_pages: 32, host_pages: 32, ..Default::default() };
//! let mut scheduler = Scheduler::new(config)?;
//! scheduler.submit(vec![RequestSpec::new("r1", vec![11, 12, 13, 14, 15])])?;
//!
//! // Step 1: the whole prompt in one prefill chunk.
//! let plan = scheduler.next_plan();
//! let row = &plan.forward.rows[0];
//! assert_eq!((row.input_length, row.extend_prefix_len), (5, 0));
//! assert_eq!(plan.forward.page_table_of(row).len(), 3); // 5 tokens + 1 reserved slot
//!
//! // The engine reports the first generated token; the next plan decodes.
//! scheduler.advance(vec![EngineEvent::ExtendResult { request_id: "r1".into(), tokens: vec![16] }])?;
//! let plan = scheduler.next_plan();
//! assert_eq!(plan.forward.decode_rows().len(), 1);
//!
//! // Finish: full pages go into the prefix cache and are written back to host.
//! scheduler.advance(vec![EngineEvent::Finish { request_id: "r1".into() }])?;
//! let plan = scheduler.next_plan();
//! assert_eq!(plan.write_backs.len(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`Scheduler`] owns its radix cache and is the direct path. The request FSM itself is
//! [`SchedulerCore`], which never touches the cache: each `advance` and each plan
//! becomes one batch of cache ops (`kvtier_radix::CacheBatch`), so the same core runs
//! as the Scheduler actor with the cache in the Radix actor (crate `kvtier`).
//!
//! Every resource a request holds (node locks, device pages, its request-pool slot) is
//! an RAII handle inside its state, so leaving a state by any path releases exactly what
//! that state held.
//!
//! # Modules
//!
//! Each module owns its types and their methods. `SchedulerCore` is defined in
//! `scheduler` and its methods are split by concern over `advance` (submit and engine
//! events), `step` (plans) and `mail` (the family mail and the cache's replies); the
//! modules below `scheduler` never import it. Each module imports only modules listed
//! below it (`use crate::` lines), so the graph has no cycle:
//!
//! ```text
//! direct ────► scheduler, outbox, request, error   Scheduler: the core + a cache it owns
//! advance ───► scheduler, ops, outbox, request, error
//! step ──────► scheduler, draft, ops, outbox, request, error
//! mail ──────► scheduler, draft, outbox, request, error
//! scheduler ─► draft, requests, ops, outbox, request, slots, error
//! draft ─────► outbox, request      a plan under construction; Awaiting, which holds it
//! requests ──► request, idmap       the request table: slab, id order, id map, tombstones
//! ops                               the op table: write-backs and backups in flight, op ids
//! outbox                            queued cache ops and their targets; family mail types
//! error ─────► request              SchedError (names a StateKind)
//! request ───► slots                a request and its states, each owning what it holds
//! idmap, slots                      id hashing; request-pool slots
//! ```
//!
//! Across the `impl SchedulerCore` files, calls go one way too: `mail::resume` hands a
//! plan's reply to `step`'s `resume_plan`, and `step` and `mail` ask `scheduler` whether
//! a reply is awaited.

mod advance;
mod direct;
mod draft;
mod error;
mod idmap;
mod mail;
mod ops;
mod outbox;
mod request;
mod requests;
mod scheduler;
mod slots;
mod step;

pub use direct::Scheduler;
pub use error::{BatchError, Rejected, SchedError};
pub use outbox::{FamilyMail, FamilyReply, Progress};
pub use request::StateKind;
pub use scheduler::{LOST_HIT_REASONS, SchedulerCore, SchedulerStats, cache_config};
