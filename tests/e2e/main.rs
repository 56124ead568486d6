//! End-to-end tests across kvtier's crates, in one test binary: the embedding API on
//! every runtime, faults across actors, the actor recipe, and the examples.

mod bad_input_flood;
mod common;
mod example;
mod fault_hooks;
mod fault_parity;
mod handle_release;
mod kv_events;
mod metrics;
mod registered_family;
mod runtime_equivalence;
mod toy_actor;
mod tracing_context;
