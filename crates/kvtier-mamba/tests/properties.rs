//! Random sequences of the Mamba family's operations keep its invariants: every slot is
//! free, held by one request, or attached to one cached state (or pending on one
//! write-back); the leaf set is exactly the device leaves; and once every request let
//! go and every write-back was acknowledged, only cached states hold slots.

use std::collections::BTreeSet;

use kvtier_mamba::{MambaConfig, MambaCore, RequestStates};
use kvtier_types::Tier;
use kvtier_types::hash::{PageHash, rolling_page_hashes};
use proptest::prelude::*;

const P: u32 = 2;

#[derive(Debug, Clone)]
enum Op {
    /// Admit a request whose prompt is base `b` cut at `pages`, with KV cached that deep
    /// on device and on host.
    Admit {
        base: u8,
        pages: u8,
        kv_device: u8,
        kv_host: u8,
    },
    /// The `i`-th live request publishes its checkpoint at `pages` of its base.
    Publish { i: u8, pages: u8 },
    /// The `i`-th live request lets go (finish, abort or retraction).
    Release { i: u8 },
    /// Write back the states on base `b`'s path.
    WriteBack { base: u8 },
    /// Acknowledge the oldest write-back in flight.
    Ack { success: bool },
    /// KV of base `b` left a tier.
    Evict { base: u8, host: bool },
    /// A new step.
    Step,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..4u8, 1..6u8, 0..6u8, 0..6u8).prop_map(|(base, pages, kv_device, kv_host)| {
            Op::Admit { base, pages, kv_device, kv_host }
        }),
        3 => (0..8u8, 1..6u8).prop_map(|(i, pages)| Op::Publish { i, pages }),
        2 => (0..8u8).prop_map(|i| Op::Release { i }),
        1 => (0..4u8).prop_map(|base| Op::WriteBack { base }),
        1 => any::<bool>().prop_map(|success| Op::Ack { success }),
        1 => (0..4u8, any::<bool>()).prop_map(|(base, host)| Op::Evict { base, host }),
        1 => Just(Op::Step),
    ]
}

/// Four bases sharing their first page in pairs, five pages each.
fn bases() -> Vec<Vec<PageHash>> {
    (0..4)
        .map(|b: i32| {
            let tokens: Vec<i32> = (0..10)
                .map(|i| if i < 2 { b / 2 } else { 10 * b + i })
                .collect();
            rolling_page_hashes(None, &tokens, P as usize)
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_operations_keep_every_slot_accounted_for(
        device_slots in 3..12u32,
        host_slots in prop_oneof![Just(0u32), 2..10u32],
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let config = MambaConfig { page_size: P, device_slots, host_slots, kernel_chunk: 4 };
        let mut c = MambaCore::new(config).expect("valid config");
        let bases = bases();
        let mut live: Vec<(usize, RequestStates)> = Vec::new();
        let mut in_flight: BTreeSet<u32> = BTreeSet::new();
        let mut next_op = 1u32;
        for op in ops {
            match op {
                Op::Admit { base, pages, kv_device, kv_host } => {
                    let b = usize::from(base);
                    let path = &bases[b][..usize::from(pages)];
                    let m = c.match_prefix(path, u32::from(kv_device), u32::from(kv_host));
                    prop_assert!(m.pages <= u32::from(kv_device.max(kv_host)).min(u32::from(pages)));
                    if let Some(a) = c.admit(m.source) {
                        live.push((b, a.states));
                    }
                }
                Op::Publish { i, pages } => {
                    if live.is_empty() { continue; }
                    let i = usize::from(i) % live.len();
                    let (b, states) = &mut live[i];
                    if let Some(slot) = states.checkpoint.take() {
                        c.publish(&bases[*b][..usize::from(pages)], slot).expect("valid path");
                    }
                }
                Op::Release { i } => {
                    if live.is_empty() { continue; }
                    let i = usize::from(i) % live.len();
                    drop(live.remove(i));
                }
                Op::WriteBack { base } => {
                    let op = next_op;
                    next_op += 1;
                    let pairs = c.prepare_write_back(op, &bases[usize::from(base)]).expect("fresh op");
                    if !pairs.is_empty() {
                        in_flight.insert(op);
                    }
                }
                Op::Ack { success } => {
                    if let Some(op) = in_flight.pop_first() {
                        c.ack_write_back(op, success).expect("in flight");
                    }
                }
                Op::Evict { base, host } => {
                    let tier = if host { Tier::Host } else { Tier::Device };
                    c.drop_states(&bases[usize::from(base)], tier);
                }
                Op::Step => c.begin_step(),
            }
            if let Err(e) = c.check_invariants() {
                prop_assert!(false, "{e}");
            }
        }
        drop(live);
        for &op in &in_flight {
            c.ack_write_back(op, false).expect("in flight");
        }
        if let Err(e) = c.check_invariants() {
            prop_assert!(false, "at the end: {e}");
        }
        prop_assert_eq!(c.request_slots(), 0, "only cached states hold slots");
    }
}
