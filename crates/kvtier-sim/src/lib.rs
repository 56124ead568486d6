//! Workloads and engine simulation of kvtier.
//!
//! The benchmark workloads W1–W3 of `design/WORKLOADS.md` run exactly as defined there:
//! the same token streams, request ids, configs, arrival rules and engine rules, so their
//! counters can be compared with the reference scheduler's, counter for counter.
//!
//! Timed calls go through the `measured_*` functions, which are never inlined, so
//! `valgrind --tool=callgrind --toggle-collect='*measured_*'` counts exactly them.

pub mod api;
pub mod campaign;
pub mod cluster;
mod digest;
pub mod engine;
pub mod groups;
pub mod hybrid;
pub mod l3_bench;
pub mod oracle;
pub mod scenario;
pub mod sweep;
pub mod tokens;
pub mod trace;
pub mod workloads;

pub use api::{Path, scheduler_on, system_on};
pub use engine::{Counters, StepDriver};
pub use workloads::{Observe, Report, WorkloadError, WorkloadKind, WorkloadOptions, run_workload};
