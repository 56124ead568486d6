//! The error type of the embedding API.

use kvtier_device::DeviceError;
use kvtier_fsm::{BatchError, SchedError};

/// Why a call through the [`crate::Handle`] failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// Some items of a submit or advance were refused (the others were applied).
    #[error(transparent)]
    Batch(#[from] BatchError),
    /// The scheduler refused the call.
    #[error(transparent)]
    Sched(#[from] SchedError),
    /// The device refused a plan's copies (nothing of that plan was applied past it).
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// `execute` on a system built without a device.
    #[error("this system has no device actor (SystemBuilder::device)")]
    NoDevice,
    /// The configuration or the wiring is invalid.
    #[error("invalid setup: {0}")]
    Setup(String),
    /// An actor stopped answering (its mailbox is closed).
    #[error("the {0} actor is gone")]
    ActorGone(&'static str),
    /// A delivery failed (a fault injected into the deterministic runtime).
    #[error("delivery of {message} to the {to} actor failed")]
    DeliveryFailed {
        /// The receiving actor.
        to: &'static str,
        /// The message.
        message: &'static str,
    },
    /// An earlier call failed mid-conversation; only `shutdown` is accepted now.
    #[error("the system failed earlier ({0}); shut it down")]
    Failed(String),
    /// The system was shut down.
    #[error("the system is shut down")]
    ShutDown,
}
