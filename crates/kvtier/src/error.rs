//! The error type of the embedding API.

use kvtier_device::DeviceError;
use kvtier_fsm::{BatchError, SchedError};
use kvtier_host::HostError;
use kvtier_types::ActorName;

/// Why a call failed.
///
/// Refusals (`Batch`, `Sched`, `Device`, `NoDevice`, `NoActor`) leave the system as it
/// was; runtime faults (`DeliveryFailed`, `ActorGone`, `UnexpectedAnswer`,
/// `UnexpectedMessage`) fail it: every later call but `shutdown` answers `Failed`. Both
/// runtimes answer the same error for the same fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
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
    /// `execute` on a system built without a device or an L3 store.
    #[error("this system has no device actor (SystemBuilder::device)")]
    NoDevice,
    /// A call for an actor the system was not built with.
    #[error("this system has no {0} actor")]
    NoActor(ActorName),
    /// The configuration or the wiring is invalid.
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// An actor stopped answering (its mailbox is closed, or its core was taken out).
    #[error("the {0} actor is gone")]
    ActorGone(ActorName),
    /// A delivery failed (a fault injected by the fault hooks).
    #[error("delivery of {message} to the {to} actor failed")]
    DeliveryFailed {
        /// The receiving actor.
        to: ActorName,
        /// The message.
        message: &'static str,
    },
    /// An actor answered something its protocol does not answer there.
    #[error("the {from} actor answered {answer}, which the conversation did not expect")]
    UnexpectedAnswer {
        /// The sender of the answer.
        from: ActorName,
        /// The reply's name.
        answer: &'static str,
    },
    /// An actor was sent a message of another protocol.
    #[error("the {to} actor cannot take {message}")]
    UnexpectedMessage {
        /// The receiving actor.
        to: ActorName,
        /// The message.
        message: &'static str,
    },
    /// The radix cache's structural check failed (a bug in kvtier, never bad input).
    #[error(transparent)]
    Cache(kvtier_radix::RadixError),
    /// An earlier call failed mid-conversation; only `shutdown` is accepted now. Holds
    /// the fault that failed it.
    #[error("the system failed earlier ({0}); shut it down")]
    Failed(Box<KvError>),
    /// The system was shut down.
    #[error("the system is shut down")]
    ShutDown,
}

impl KvError {
    /// Whether this is a runtime fault, which fails the system (a refusal does not).
    pub fn is_runtime_fault(&self) -> bool {
        matches!(
            self,
            KvError::ActorGone(_)
                | KvError::DeliveryFailed { .. }
                | KvError::UnexpectedAnswer { .. }
                | KvError::UnexpectedMessage { .. }
        )
    }
}

/// Why a system could not be built or started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// An L3 actor without `enable_l3_storage`.
    #[error("an L3 actor needs enable_l3_storage in the scheduler config")]
    L3StorageDisabled,
    /// The L3 actor's pages or host arena do not fit the scheduler's.
    #[error(
        "the L3 actor moves pages of {l3_page_size} tokens in a host arena of {arena_pages} \
         pages; the scheduler has pages of {page_size} tokens and {host_pages} host pages"
    )]
    L3Geometry {
        /// The L3 core's page size.
        l3_page_size: u32,
        /// The pages of the L3 core's host arena.
        arena_pages: u32,
        /// The scheduler's page size.
        page_size: u32,
        /// The scheduler's host pages.
        host_pages: u32,
    },
    /// The KV event publisher could not bind its socket.
    #[error("the KV event publisher: {0}")]
    Publisher(String),
    /// The OTLP endpoint is not an `http://` URL.
    #[error("OTLP endpoint {0:?} is not an http:// URL (OTLP/HTTP, e.g. http://127.0.0.1:4318)")]
    OtlpEndpoint(String),
    /// An OpenTelemetry exporter could not be built.
    #[error("cannot build the OTLP exporter: {0}")]
    OtlpExporter(String),
    /// A global `tracing` subscriber was installed already.
    #[error("a global tracing subscriber is already installed")]
    SubscriberInstalled,
    /// The host allocator could not lease the cache its host tier.
    #[error("the radix cache's host lease: {0}")]
    HostLease(HostError),
    /// The radix cache refused its host lease, or a registered cache family.
    #[error("the radix cache: {0}")]
    Cache(kvtier_radix::RadixError),
    /// Two actors of one name.
    #[error("two actors are named {0}")]
    DuplicateActor(ActorName),
    /// A thread could not be started.
    #[error("cannot start the {0} thread")]
    Thread(&'static str),
}
