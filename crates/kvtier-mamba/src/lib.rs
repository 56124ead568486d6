//! The Mamba (recurrent-state) cache family of kvtier.
//!
//! Hybrid models (attention layers beside Mamba or linear-attention layers) can reuse a
//! cached KV prefix only up to a point where the recurrent state after that prefix is
//! also cached: KV depth without its state is never reusable. This crate keeps those
//! states:
//!
//! * [`SlotPool`] / [`Slot`]: device and host pools of state slots (smallest free index
//!   first, slot 0 a dummy) and the RAII handle that returns a slot when dropped;
//! * [`checkpoint_depth`]: where a chunk's checkpoint state lands, the one rule the
//!   worker and the scheduler share;
//! * [`MambaCore`]: the cached states, known by the rolling hash of the prefix they
//!   follow (so a radix split cannot move one), their match cap, eviction of device
//!   leaves by `(time, seq)`, admission of request pairs, and host copies that become
//!   valid only when the write-back that fills exactly them is acknowledged.

mod checkpoint;
mod core;
mod error;
pub mod protocol;
mod slots;
mod states;

pub use checkpoint::{align_down, checkpoint_depth, decode_checkpoint_depth};
pub use core::{
    Admitted, MambaConfig, MambaCore, MambaStats, RequestStates, StateMatch, StateSource,
};
pub use error::MambaError;
pub use protocol::{MambaMsg, MambaOp, MambaReply, MambaResult};
pub use slots::{Slot, SlotId, SlotPool};
pub use states::StateKey;
