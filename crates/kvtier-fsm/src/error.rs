//! The error type of this crate.

use kvtier_types::{OpId, RequestId, TypesError};

use crate::StateKind;

/// Why the scheduler refused a request or an event. The scheduler's state is unchanged
/// by a refused item.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchedError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] TypesError),
    /// The cache cannot host what it was given (a registered family beside a built-in).
    #[error(transparent)]
    Cache(#[from] kvtier_radix::RadixError),
    /// A live request already has this id.
    #[error("request {0} already exists")]
    DuplicateRequest(RequestId),
    /// No live or recently finished request has this id.
    #[error("unknown request {0}")]
    UnknownRequest(RequestId),
    /// A prompt without tokens.
    #[error("request {0} has an empty prompt")]
    EmptyPrompt(RequestId),
    /// A prompt that can never fit in the device pool.
    #[error(
        "request {id}: a {tokens}-token prompt needs {pages} device pages, the pool has {usable}"
    )]
    PromptTooLong {
        /// The request.
        id: RequestId,
        /// Prompt tokens.
        tokens: usize,
        /// Pages it needs.
        pages: u64,
        /// Usable device pages.
        usable: u32,
    },
    /// A prompt that can never fit a paged-cache group's pool.
    #[error(
        "request {id}: a {tokens}-token prompt needs {pages} pages of group `{group}`, the pool has {usable}"
    )]
    PromptTooLongForGroup {
        /// The request.
        id: RequestId,
        /// Prompt tokens.
        tokens: usize,
        /// The group.
        group: String,
        /// Pages it needs.
        pages: u32,
        /// Usable pages of the group's pool.
        usable: u32,
    },
    /// A token id outside the valid range (negative).
    #[error("request {id}: invalid token {token}")]
    InvalidToken {
        /// The request.
        id: RequestId,
        /// The token.
        token: i32,
    },
    /// An event that is not valid in the request's current state.
    #[error("FSM transition invalid: event={event}; state={state:?} (request {id})")]
    InvalidTransition {
        /// The request.
        id: RequestId,
        /// The event.
        event: &'static str,
        /// The state it was in.
        state: StateKind,
    },
    /// An acknowledgement for an op id that was never issued.
    #[error("unknown cache op {0}")]
    UnknownOp(OpId),
    /// A load-back failure reported after the next plan was built: that plan may have
    /// read its pages. Report failures in the `advance` that follows their plan.
    #[error("load-back {0} failed after the next plan was built")]
    LateLoadBackFailure(OpId),
    /// A request's L3 information does not fit its prompt.
    #[error("request {id}: {problem}")]
    InvalidStorageInfo {
        /// The request.
        id: RequestId,
        /// What is wrong.
        problem: String,
    },
    /// A capability that arrives in a later version.
    #[error("{0} is not supported yet")]
    Unsupported(&'static str),
    /// A new plan was asked for while the reply to the last cache batch is still due.
    #[error("a cache batch is still awaiting its reply")]
    Busy,
    /// A cache reply that does not answer the batch the scheduler sent.
    #[error("a cache reply does not match the batch it answers")]
    UnexpectedReply,
}

/// One refused item of a batch: its position in the batch and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// Index in the submitted batch.
    pub index: usize,
    /// Why it was refused.
    pub error: SchedError,
}

/// Items of a batch that were refused; every other item was applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} of the batch refused; first: {}", rejected.len(), rejected.first().map(|r| r.error.to_string()).unwrap_or_default())]
pub struct BatchError {
    /// The refused items, in batch order.
    pub rejected: Vec<Rejected>,
}
