//! The Mamba (recurrent-state) cache family of kvtier.
//!
//! Hybrid models (attention layers beside Mamba or linear-attention layers) can reuse a
//! cached KV prefix only up to a point where the recurrent state after that prefix is
//! also cached: KV depth without its state is never reusable. This crate keeps those
//! states:
//!
//! * [`SlotPool`] / [`Slot`]: device and host pools of state slots (smallest free index
//!   first, no dummy slot) and the RAII handle that returns a slot when dropped;
//! * [`RequestStates`]: a request's working and checkpoint slots;
//! * [`checkpoint_depth`]: where a chunk's checkpoint state lands, the one rule the
//!   worker and the scheduler share;
//! * [`MambaFamily`]: the states attached to the nodes of a prefix tree ([`StateTree`]),
//!   their match cap, eviction of leaves by `(time, seq)`, host copies valid only when
//!   the write-back that fills exactly them is acknowledged, and load-backs.
//!
//! The radix cache hosts the family: admission needs the KV tree and its states in one
//! place (docs/mamba.md says why).

mod checkpoint;
mod error;
mod family;
mod request;
mod slots;

pub use checkpoint::{CheckpointNeed, align_down, checkpoint_depth, decode_checkpoint_depth};
pub use error::MambaError;
pub use family::{CappedMatch, MambaConfig, MambaFamily, MambaStats, StateTree};
pub use request::RequestStates;
pub use slots::{Slot, SlotId, SlotPool};
