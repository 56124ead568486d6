//! A request's tokens as the cache's protocol and its prompt marks share them.

use std::ops::Deref;
use std::sync::Arc;

use kvtier_types::Token;

/// The first `len` tokens of a request, shared without copying.
#[derive(Debug, Clone)]
pub struct TokenRef {
    tokens: Arc<Vec<Token>>,
    len: usize,
}

impl TokenRef {
    /// The whole token vector it is a prefix of (one allocation per request's tokens).
    pub(crate) fn whole(&self) -> &Arc<Vec<Token>> {
        &self.tokens
    }

    /// The first `len` tokens of `tokens` (clamped to its length).
    pub fn new(tokens: &Arc<Vec<Token>>, len: usize) -> Self {
        Self {
            tokens: Arc::clone(tokens),
            len: len.min(tokens.len()),
        }
    }
}

impl Deref for TokenRef {
    type Target = [Token];

    fn deref(&self) -> &[Token] {
        &self.tokens[..self.len]
    }
}
