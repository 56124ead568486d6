//! What an engine submits, and the L3 lookup a submission starts.

use std::sync::Arc;

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

/// The full pages of a prompt of `tokens` tokens before its last token: the pages an L3
/// lookup can find (the last token is always computed).
pub fn lookup_pages(tokens: usize, page_size: u32) -> usize {
    tokens.saturating_sub(1) / page_size.max(1) as usize
}

/// Prompts whose L3 lookup is under way, under one ticket: the scheduler holds their
/// requests (looking up) until the answer comes back with the same ticket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupAsk {
    /// Names this lookup among those in flight.
    pub ticket: u64,
    /// The prompts, shared with the requests (no copy).
    pub prompts: Vec<Arc<Vec<Token>>>,
}
