//! KV-cache event buffer: `BlockStored` / `BlockRemoved` per medium (device, host, L3),
//! de-duplicated by each medium's set of published block hashes.

use std::collections::HashSet;

use kvtier_types::{KvEvent, Medium, Token};

#[derive(Debug, Default)]
pub(crate) struct EventSink {
    pub buffer: Vec<KvEvent>,
    /// Per medium; membership only, never iterated, so its order cannot reach a
    /// decision.
    published: [HashSet<u64>; 3],
}

impl EventSink {
    pub fn stored(
        &mut self,
        hash: u64,
        parent: Option<u64>,
        tokens: &[Token],
        block_size: u32,
        medium: Medium,
    ) {
        if self.published[medium.index()].insert(hash) {
            self.buffer.push(KvEvent::BlockStored {
                block_hashes: vec![hash],
                parent_block_hash: parent,
                token_ids: tokens.to_vec(),
                block_size,
                medium,
            });
        }
    }

    pub fn removed(&mut self, hashes: &[u64], medium: Medium) {
        let published = &mut self.published[medium.index()];
        let gone: Vec<u64> = hashes
            .iter()
            .copied()
            .filter(|h| published.remove(h))
            .collect();
        if !gone.is_empty() {
            self.buffer.push(KvEvent::BlockRemoved {
                block_hashes: gone,
                medium,
            });
        }
    }
}
