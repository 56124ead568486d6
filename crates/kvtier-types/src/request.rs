//! What an engine submits.

use crate::{RequestId, Token, hash::PageHash};

/// One request as submitted: its id and prompt, plus optional L3 information the
/// engine looked up before submitting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestSpec {
    /// Unique among live requests.
    pub id: RequestId,
    /// Prompt tokens. Must be non-empty.
    pub tokens: Vec<Token>,
    /// Rolling page hashes of the prompt's full pages, if the engine computed them (it
    /// needs them to query L3). The scheduler never trusts them for keys: it derives every
    /// hash from the tokens and the page's position.
    pub rolling_hashes: Vec<PageHash>,
    /// Consecutive prompt pages found in the L3 store.
    pub storage_hit_pages: u32,
}

impl RequestSpec {
    /// A request with no L3 information.
    pub fn new(id: impl Into<RequestId>, tokens: Vec<Token>) -> Self {
        Self {
            id: id.into(),
            tokens,
            rolling_hashes: Vec::new(),
            storage_hit_pages: 0,
        }
    }
}
