//! KV-cache event buffer: device-tier `BlockStored` / `BlockRemoved`, de-duplicated by a
//! set of published block hashes.

use std::collections::HashSet;

use kvtier_types::{KvEvent, Tier, Token};

#[derive(Debug, Default)]
pub(crate) struct EventSink {
    pub buffer: Vec<KvEvent>,
    /// Membership only; never iterated, so its order cannot reach a decision.
    published: HashSet<u64>,
}

impl EventSink {
    pub fn stored(&mut self, hash: u64, parent: Option<u64>, tokens: &[Token], block_size: u32) {
        if self.published.insert(hash) {
            self.buffer.push(KvEvent::BlockStored {
                block_hashes: vec![hash],
                parent_block_hash: parent,
                token_ids: tokens.to_vec(),
                block_size,
                medium: Tier::Device,
            });
        }
    }

    pub fn removed(&mut self, hashes: &[u64]) {
        let gone: Vec<u64> = hashes
            .iter()
            .copied()
            .filter(|h| self.published.remove(h))
            .collect();
        if !gone.is_empty() {
            self.buffer.push(KvEvent::BlockRemoved {
                block_hashes: gone,
                medium: Tier::Device,
            });
        }
    }
}
