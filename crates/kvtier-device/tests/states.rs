//! A hybrid model's recurrent states beside its KV: state slots ride in the same
//! write-back and load-back ops as KV pages (pairs of kind `Mamba`), through the same
//! kernels, and a refused op moves nothing.

use kvtier_device::{DeviceCore, DeviceError, KvArenas, KvGeometry, StateGeometry};
use kvtier_types::{
    EngineEvent, ExecutionPlan, LoadBackOp, Tier, TransferKind, TransferPair, WriteBackOp,
};

fn kv() -> KvGeometry {
    KvGeometry {
        layers: 2,
        planes: 2,
        heads: 1,
        head_dim: 4,
        dtype_bytes: 2,
        page_size: 2,
    }
}

const STATE: StateGeometry = StateGeometry {
    layers: 3,
    bytes_per_layer: 16,
};

fn arenas() -> KvArenas {
    KvArenas::new(kv(), 8, 8, 1)
        .expect("arenas")
        .with_states(STATE, 4, 4)
        .expect("state arenas")
}

fn state(src: u32, dst: u32) -> TransferPair {
    TransferPair {
        kind: TransferKind::Mamba,
        src,
        dst,
    }
}

fn fill_state(a: &mut KvArenas, tier: Tier, slot: u32, tag: u8) {
    for layer in 0..STATE.layers {
        let mut item = a.state_item_mut(tier, slot, layer).expect("slot in range");
        for (i, b) in item.iter_mut().enumerate() {
            *b = tag ^ (layer as u8 * 16 + i as u8);
        }
    }
}

fn holds_state(a: &mut KvArenas, tier: Tier, slot: u32, tag: u8) -> bool {
    (0..STATE.layers).all(|layer| {
        let item = a.state_item_mut(tier, slot, layer).expect("slot in range");
        item.iter()
            .enumerate()
            .all(|(i, &b)| b == tag ^ (layer as u8 * 16 + i as u8))
    })
}

fn fill_page(a: &mut KvArenas, tier: Tier, page: u32, tag: u8) {
    for layer in 0..2 {
        for plane in 0..2 {
            let mut item = a.item_mut(tier, page, layer, plane).expect("page in range");
            item.fill(tag ^ (layer as u8 * 2 + plane as u8));
        }
    }
}

fn holds_page(a: &mut KvArenas, tier: Tier, page: u32, tag: u8) -> bool {
    (0..2).all(|layer| {
        (0..2).all(|plane| {
            let item = a.item_mut(tier, page, layer, plane).expect("page in range");
            item.iter()
                .all(|&b| b == tag ^ (layer as u8 * 2 + plane as u8))
        })
    })
}

/// One write-back carries a KV page and a state slot (slot 0 included: state pools have
/// no dummy); one load-back brings both back, the state whole even when the KV load
/// covers some layers only.
#[test]
fn states_ride_with_kv_pages_both_ways() {
    let mut a = arenas();
    fill_page(&mut a, Tier::Device, 3, 0x11);
    fill_state(&mut a, Tier::Device, 0, 0x22);
    a.write_back(&[TransferPair::kv(3, 5), state(0, 2)])
        .expect("copied");
    assert!(holds_page(&mut a, Tier::Host, 5, 0x11));
    assert!(holds_state(&mut a, Tier::Host, 2, 0x22));
    a.load_back(&[TransferPair::kv(5, 6), state(2, 3)], 0..1)
        .expect("copied");
    assert!(
        holds_state(&mut a, Tier::Device, 3, 0x22),
        "the whole state"
    );
}

/// A copy-on-write source copied into a working slot.
#[test]
fn device_states_copy_to_working_slots() {
    let mut a = arenas();
    fill_state(&mut a, Tier::Device, 1, 0x33);
    a.copy_device_states(&[state(1, 2)]).expect("copied");
    assert!(holds_state(&mut a, Tier::Device, 2, 0x33));
    assert!(matches!(
        a.copy_device_states(&[TransferPair::kv(1, 2)]),
        Err(DeviceError::WrongKind("KV"))
    ));
}

/// A state pair out of range, or with no state arenas, refuses the whole op: the KV
/// page beside it is not copied either.
#[test]
fn a_refused_state_pair_moves_nothing() {
    let mut a = arenas();
    fill_page(&mut a, Tier::Device, 3, 0x44);
    assert!(matches!(
        a.write_back(&[TransferPair::kv(3, 5), state(0, 4)]),
        Err(DeviceError::PageOutOfRange { .. })
    ));
    assert!(!holds_page(&mut a, Tier::Host, 5, 0x44));
    let mut plain = KvArenas::new(kv(), 8, 8, 1).expect("arenas");
    fill_page(&mut plain, Tier::Device, 3, 0x44);
    assert!(matches!(
        plain.write_back(&[TransferPair::kv(3, 5), state(0, 1)]),
        Err(DeviceError::WrongKind("Mamba"))
    ));
    assert!(!holds_page(&mut plain, Tier::Host, 5, 0x44));
}

/// Through the device actor's core: a write-back with a state slot is acknowledged as
/// a success and moved the state; the same op on a device without state arenas is a
/// failed copy (a miss later), and a load-back of a state it cannot hold is reported
/// failed.
#[test]
fn the_device_executes_state_pairs_and_fails_those_it_cannot_hold() {
    let plan = ExecutionPlan {
        write_backs: vec![WriteBackOp {
            op_id: 1,
            pairs: vec![TransferPair::kv(3, 5), state(1, 1)],
            is_retract: false,
        }],
        load_backs: vec![LoadBackOp {
            op_id: 2,
            pairs: vec![TransferPair::kv(4, 6), state(2, 2)],
        }],
        ..ExecutionPlan::default()
    };
    let mut hybrid = DeviceCore::new(arenas());
    fill_state(hybrid.arenas_mut(), Tier::Device, 1, 0x55);
    fill_state(hybrid.arenas_mut(), Tier::Host, 2, 0x66);
    let events = hybrid.execute(&plan, &[]).expect("executed");
    assert_eq!(
        events,
        [EngineEvent::WriteBackDone {
            op_id: 1,
            success: true
        }]
    );
    assert!(holds_state(hybrid.arenas_mut(), Tier::Host, 1, 0x55));
    assert!(holds_state(hybrid.arenas_mut(), Tier::Device, 2, 0x66));

    let mut plain = DeviceCore::new(KvArenas::new(kv(), 8, 8, 1).expect("arenas"));
    let events = plain.execute(&plan, &[]).expect("executed");
    assert_eq!(
        events,
        [
            EngineEvent::WriteBackDone {
                op_id: 1,
                success: false
            },
            EngineEvent::LoadBackFailed { op_id: 2 }
        ]
    );
}
