//! KV events on vLLM's wire: the msgpack `KVEventBatch` routers (Dynamo, llm-d, vLLM's
//! own) read, byte for byte as vLLM's encoder writes it.
//!
//! A batch is the array `[ts, events, data_parallel_rank]`: a float64 timestamp, the
//! events, and the rank (nil when there is none). Each event is a map tagged by `type`,
//! with vLLM's fields in vLLM's order, and the fields kvtier has no use for present as
//! nil (`lora_id`, `lora_name`): a consumer that reads a fixed set of keys finds them
//! all. vLLM's encoder (msgspec) gives every event map a 16-bit length header, even a
//! short one; the test vector below pins that down.

use kvtier_types::{KvEvent, Medium};
use rmp::encode;

/// One event of a batch.
#[derive(Debug, Clone, Copy)]
pub enum WireEvent<'a> {
    /// A page stored or removed, as the radix cache reported it.
    Cache(&'a KvEvent),
    /// Every block of the publisher is gone (sent first, so a router starts clean).
    AllBlocksCleared,
}

/// The `medium` a tier is published as: routers map `GPU` to the device tier, `CPU` to
/// host memory and `DISK` to their storage tier (Dynamo's indexer answers it as `disk`;
/// never as the device). The L3 store is published as `DISK` whether it is Mooncake or
/// the embedded local store: the storage medium every router knows.
pub fn medium(medium: Medium) -> &'static str {
    match medium {
        Medium::Device => "GPU",
        Medium::Host => "CPU",
        Medium::Storage => "DISK",
    }
}

/// Encodes one `KVEventBatch`.
pub fn encode_batch(ts: f64, events: &[WireEvent<'_>], data_parallel_rank: Option<u32>) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = encode::write_array_len(&mut out, 3);
    let _ = encode::write_f64(&mut out, ts);
    // Events of kinds vLLM has no counterpart for are left out.
    let wired: Vec<WireEvent<'_>> = events.iter().copied().filter(|e| on_wire(*e)).collect();
    let _ = encode::write_array_len(&mut out, wired.len() as u32);
    for event in wired {
        event_map(&mut out, event);
    }
    match data_parallel_rank {
        Some(rank) => {
            let _ = encode::write_uint(&mut out, u64::from(rank));
        }
        None => {
            let _ = encode::write_nil(&mut out);
        }
    }
    out
}

/// Whether vLLM's wire has the event.
fn on_wire(event: WireEvent<'_>) -> bool {
    matches!(
        event,
        WireEvent::AllBlocksCleared
            | WireEvent::Cache(KvEvent::BlockStored { .. } | KvEvent::BlockRemoved { .. })
    )
}

/// An event as a map with a 16-bit length header (msgspec's, whatever the length).
fn event_map(out: &mut Vec<u8>, event: WireEvent<'_>) {
    let map16 = |out: &mut Vec<u8>, n: u16| {
        out.push(0xde);
        out.extend_from_slice(&n.to_be_bytes());
    };
    let key = |out: &mut Vec<u8>, k: &str| {
        let _ = encode::write_str(out, k);
    };
    match event {
        WireEvent::Cache(KvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            medium: tier,
        }) => {
            map16(out, 8);
            key(out, "type");
            key(out, "BlockStored");
            key(out, "block_hashes");
            hashes(out, block_hashes);
            key(out, "parent_block_hash");
            match parent_block_hash {
                Some(hash) => {
                    let _ = encode::write_uint(out, *hash);
                }
                None => {
                    let _ = encode::write_nil(out);
                }
            }
            key(out, "token_ids");
            let _ = encode::write_array_len(out, token_ids.len() as u32);
            for &token in token_ids {
                let _ = encode::write_sint(out, i64::from(token));
            }
            key(out, "block_size");
            let _ = encode::write_uint(out, u64::from(*block_size));
            key(out, "lora_id");
            let _ = encode::write_nil(out);
            key(out, "medium");
            key(out, medium(*tier));
            key(out, "lora_name");
            let _ = encode::write_nil(out);
        }
        WireEvent::Cache(KvEvent::BlockRemoved {
            block_hashes,
            medium: tier,
        }) => {
            map16(out, 3);
            key(out, "type");
            key(out, "BlockRemoved");
            key(out, "block_hashes");
            hashes(out, block_hashes);
            key(out, "medium");
            key(out, medium(*tier));
        }
        WireEvent::AllBlocksCleared => {
            map16(out, 1);
            key(out, "type");
            key(out, "AllBlocksCleared");
        }
        // Left out by `encode_batch` (`on_wire`).
        WireEvent::Cache(_) => {}
    }
}

fn hashes(out: &mut Vec<u8>, block_hashes: &[u64]) {
    let _ = encode::write_array_len(out, block_hashes.len() as u32);
    for &hash in block_hashes {
        let _ = encode::write_uint(out, hash);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The `BlockStored` of issue 14's vector: hash 111, tokens 1–4, block size 4, on
    /// the device.
    pub(crate) fn vector_event() -> KvEvent {
        KvEvent::BlockStored {
            block_hashes: vec![111],
            parent_block_hash: None,
            token_ids: vec![1, 2, 3, 4],
            block_size: 4,
            medium: Medium::Device,
        }
    }

    /// That event at ts 1.5, dp rank 0, as vLLM's own encoder writes it.
    #[test]
    fn block_stored_is_byte_for_byte_vllms() {
        let event = vector_event();
        let bytes = encode_batch(1.5, &[WireEvent::Cache(&event)], Some(0));
        assert_eq!(
            hex(&bytes),
            "93cb3ff800000000000091de0008a474797065ab426c6f636b53746f726564ac626c6f636b5f6861\
             73686573916fb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739401020304\
             aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e61\
             6d65c000"
        );
    }

    /// Large hashes and a parent take msgpack's wider integers; removals and the clear
    /// are maps tagged the same way; no rank is nil.
    #[test]
    fn other_events_and_wide_integers() {
        let stored = KvEvent::BlockStored {
            block_hashes: vec![u64::MAX],
            parent_block_hash: Some(300),
            token_ids: vec![70_000],
            block_size: 16,
            medium: Medium::Host,
        };
        let removed = KvEvent::BlockRemoved {
            block_hashes: vec![1, 2],
            medium: Medium::Device,
        };
        let bytes = encode_batch(
            0.0,
            &[
                WireEvent::AllBlocksCleared,
                WireEvent::Cache(&stored),
                WireEvent::Cache(&removed),
            ],
            None,
        );
        let h = hex(&bytes);
        assert!(h.starts_with("93cb0000000000000000" /* [0.0, */), "{h}");
        assert!(h.ends_with("c0"), "no rank: nil");
        assert!(h.contains("de0001a474797065b0416c6c426c6f636b73436c6561726564"));
        assert!(h.contains("91cfffffffffffffffff"), "u64::MAX as uint64");
        assert!(h.contains("cd012c"), "parent 300 as uint16");
        assert!(h.contains("91ce00011170"), "token 70000 as uint32");
        assert!(h.contains("a3435055"), "host as CPU");
        assert!(h.contains("de0003a474797065ac426c6f636b52656d6f766564ac626c6f636b5f686173686573920102a66d656469756da3475055"));
    }
}
