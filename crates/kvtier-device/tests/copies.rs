//! The CPU kernel backend through the checked Rust API: every byte lands where the
//! layouts say, and refused requests copy nothing.

use kvtier_device::{DeviceError, KvArenas, KvGeometry};
use kvtier_types::{Tier, TransferKind, TransferPair};

fn geometry(layers: u32) -> KvGeometry {
    KvGeometry {
        layers,
        planes: 2,
        heads: 2,
        head_dim: 4,
        dtype_bytes: 2,
        page_size: 4,
    }
}

/// A byte pattern unique to (tier tag, page, layer, plane, offset).
fn pattern(tag: u8, page: u32, layer: u32, plane: u32, i: usize) -> u8 {
    (tag as u32 * 131 + page * 31 + layer * 7 + plane * 3 + i as u32) as u8
}

fn fill(a: &mut KvArenas, tier: Tier, tag: u8, page: u32) {
    let g = *a.geometry();
    for layer in 0..g.layers {
        for plane in 0..g.planes {
            let mut item = a.item_mut(tier, page, layer, plane).expect("item in range");
            for (i, b) in item.iter_mut().enumerate() {
                *b = pattern(tag, page, layer, plane, i);
            }
        }
    }
}

/// Whether `page` on `tier` holds the pattern written for (`tag`, `from`) in `layers`.
fn holds(
    a: &mut KvArenas,
    tier: Tier,
    page: u32,
    tag: u8,
    from: u32,
    layers: std::ops::Range<u32>,
) -> bool {
    let planes = a.geometry().planes;
    layers.into_iter().all(|layer| {
        (0..planes).all(|plane| {
            let item = a.item_mut(tier, page, layer, plane).expect("item in range");
            item.iter()
                .enumerate()
                .all(|(i, &b)| b == pattern(tag, from, layer, plane, i))
        })
    })
}

fn is_zero(a: &mut KvArenas, tier: Tier, page: u32, layers: std::ops::Range<u32>) -> bool {
    let planes = a.geometry().planes;
    layers.into_iter().all(|layer| {
        (0..planes).all(|plane| {
            a.item_mut(tier, page, layer, plane)
                .expect("item in range")
                .iter()
                .all(|&b| b == 0)
        })
    })
}

#[test]
fn geometry_fixes_the_item_size() {
    let a = KvArenas::new(geometry(3), 8, 8, 1).unwrap();
    assert_eq!(a.geometry().item_bytes(), 4 * 2 * 4 * 2);
    assert_eq!(a.backend(), "cpu");
}

#[test]
fn write_back_then_load_back_round_trips_every_byte() {
    let mut a = KvArenas::new(geometry(3), 8, 8, 1).unwrap();
    for page in [1, 2, 3] {
        fill(&mut a, Tier::Device, 1, page);
    }
    a.write_back(&[
        TransferPair::kv(1, 5),
        TransferPair::kv(2, 6),
        TransferPair::kv(3, 7),
    ])
    .unwrap();
    assert!(holds(&mut a, Tier::Host, 5, 1, 1, 0..3));
    assert!(holds(&mut a, Tier::Host, 7, 1, 3, 0..3));
    assert!(
        is_zero(&mut a, Tier::Host, 4, 0..3),
        "untouched host pages stay zero"
    );
    a.zero_device(&[1, 2, 3]).unwrap();
    assert!(is_zero(&mut a, Tier::Device, 2, 0..3));
    a.load_back(&[TransferPair::kv(6, 4)], 0..3).unwrap();
    assert!(
        holds(&mut a, Tier::Device, 4, 1, 2, 0..3),
        "host page 6 held device page 2's KV"
    );
}

#[test]
fn layer_wise_load_back_moves_only_those_layers() {
    let mut a = KvArenas::new(geometry(4), 8, 8, 1).unwrap();
    fill(&mut a, Tier::Host, 2, 3);
    a.load_back(&[TransferPair::kv(3, 1)], 0..1).unwrap();
    assert!(holds(&mut a, Tier::Device, 1, 2, 3, 0..1));
    assert!(
        is_zero(&mut a, Tier::Device, 1, 1..4),
        "later layers not loaded yet"
    );
    a.load_back(&[TransferPair::kv(3, 1)], 1..4).unwrap();
    assert!(holds(&mut a, Tier::Device, 1, 2, 3, 0..4));
}

#[test]
fn device_to_device_copies_all_layers() {
    let mut a = KvArenas::new(geometry(2), 8, 2, 1).unwrap();
    fill(&mut a, Tier::Device, 3, 7);
    a.copy_device(&[TransferPair::kv(7, 2)]).unwrap();
    assert!(holds(&mut a, Tier::Device, 2, 3, 7, 0..2));
    assert!(
        holds(&mut a, Tier::Device, 7, 3, 7, 0..2),
        "the source is intact"
    );
}

#[test]
fn large_batches_split_over_threads_copy_correctly() {
    // 64 KiB pages, 256 pairs: 16 MiB per direction, above the parallel threshold.
    let g = KvGeometry {
        layers: 8,
        planes: 2,
        heads: 8,
        head_dim: 128,
        dtype_bytes: 2,
        page_size: 2,
    };
    assert_eq!(g.page_bytes(), 64 << 10);
    let mut a = KvArenas::new(g, 300, 300, 4).unwrap();
    let pairs: Vec<TransferPair> = (1..=256).map(|p| TransferPair::kv(p, 300 - p)).collect();
    for p in 1..=256 {
        fill(&mut a, Tier::Device, 4, p);
    }
    a.write_back(&pairs).unwrap();
    for p in [1, 100, 256] {
        assert!(holds(&mut a, Tier::Host, 300 - p, 4, p, 0..8), "page {p}");
    }
}

#[test]
fn refused_requests_copy_nothing() {
    let mut a = KvArenas::new(geometry(2), 4, 4, 1).unwrap();
    fill(&mut a, Tier::Device, 5, 1);
    let cases: Vec<(Result<(), DeviceError>, &str)> = vec![
        (
            a.write_back(&[TransferPair::kv(1, 2), TransferPair::kv(1, 4)]),
            "host page 4",
        ),
        (
            a.write_back(&[TransferPair::kv(1, 2), TransferPair::kv(0, 3)]),
            "page 0",
        ),
        (a.load_back(&[TransferPair::kv(2, 1)], 1..3), "layers"),
        (
            a.copy_device(&[TransferPair {
                kind: TransferKind::Mamba,
                src: 1,
                dst: 2,
            }]),
            "Mamba",
        ),
        (a.zero_device(&[1, 9]), "device page 9"),
    ];
    for (result, what) in cases {
        assert!(result.is_err(), "{what} accepted");
    }
    assert!(
        is_zero(&mut a, Tier::Host, 2, 0..2),
        "a batch with one bad pair copies nothing"
    );
    assert!(
        holds(&mut a, Tier::Device, 1, 5, 1, 0..2),
        "a refused zeroing zeroes nothing"
    );
    assert!(matches!(
        a.item_mut(Tier::Host, 4, 0, 0),
        Err(DeviceError::PageOutOfRange {
            tier: Tier::Host,
            page: 4,
            pages: 4
        })
    ));
    assert!(
        a.item_mut(Tier::Device, 1, 0, 2).is_err(),
        "plane out of range"
    );
}

#[test]
fn invalid_geometry_is_refused() {
    let g = KvGeometry {
        layers: 0,
        ..geometry(1)
    };
    assert!(matches!(
        KvArenas::new(g, 4, 4, 1),
        Err(DeviceError::InvalidGeometry(_))
    ));
}

#[test]
fn arenas_move_across_threads() {
    let mut a = KvArenas::new(geometry(1), 4, 4, 1).unwrap();
    fill(&mut a, Tier::Device, 6, 1);
    let mut a = std::thread::spawn(move || {
        a.write_back(&[TransferPair::kv(1, 1)]).unwrap();
        a
    })
    .join()
    .unwrap();
    assert!(holds(&mut a, Tier::Host, 1, 6, 1, 0..1));
}

#[test]
fn copies_never_meet_another_transfer_on_a_host_page() {
    // The L3 actor shares the host arena: while it holds a page, a copy that would
    // touch that page is refused and moves nothing.
    let mut a = KvArenas::new(geometry(2), 8, 8, 1).unwrap();
    let host = a.host_arena();
    fill(&mut a, Tier::Device, 1, 1);
    fill(&mut a, Tier::Host, 2, 5);
    let prefetching = host.write(&[4]).unwrap();
    assert!(matches!(
        a.write_back(&[TransferPair::kv(1, 3), TransferPair::kv(1, 4)]),
        Err(DeviceError::Host(kvtier_host::HostError::PageBusy {
            page: 4
        }))
    ));
    assert!(
        is_zero(&mut a, Tier::Host, 3, 0..2),
        "a refused write-back writes no page"
    );
    assert!(matches!(
        a.load_back(&[TransferPair::kv(4, 2)], 0..2),
        Err(DeviceError::Host(_))
    ));
    drop(prefetching);
    // Readers share: a backup reading page 5 does not stop a load-back reading it.
    let backing_up = host.read(&[5]).unwrap();
    a.load_back(&[TransferPair::kv(5, 2)], 0..2).unwrap();
    assert!(holds(&mut a, Tier::Device, 2, 2, 5, 0..2));
    assert!(matches!(
        a.write_back(&[TransferPair::kv(1, 5)]),
        Err(DeviceError::Host(_))
    ));
    drop(backing_up);
    a.write_back(&[TransferPair::kv(1, 4)]).unwrap();
    assert!(holds(&mut a, Tier::Host, 4, 1, 1, 0..2));
}
