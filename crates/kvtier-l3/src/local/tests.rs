//! Unit tests of the embedded store: promotions, their deadline, the TTL sweep.

use super::*;

fn keys(n: usize) -> Vec<L3Key> {
    (0..n)
        .map(|i| L3Key::from_stored(format!("ns/{i}")))
        .collect()
}

/// The payload of object `i`: never all zeros, so a buffer left untouched cannot
/// pass for it.
fn payload(i: usize) -> Vec<u8> {
    vec![i as u8 + 1; 64]
}

/// A store whose workers wait at a gate, filled with `n` objects that are on disk
/// only (the store is reopened, so its memory tier is empty). Returns the gate's
/// opener and the receiver told when a get starts waiting.
fn gated(
    dir: &Path,
    n: usize,
    ttl: Duration,
    deadline: Duration,
) -> (LocalStore, flume::Sender<()>, flume::Receiver<()>) {
    let cfg = LocalStoreConfig {
        prefetch_ttl: ttl,
        get_deadline: deadline,
        ..LocalStoreConfig::new(dir, 1 << 20, 1 << 20)
    };
    {
        let mut s = LocalStore::open(cfg.clone()).unwrap();
        let payloads: Vec<Vec<u8>> = (0..n).map(payload).collect();
        let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        s.put(&keys(n), &refs).unwrap();
    }
    let (open_tx, open) = flume::unbounded();
    let (waiting, waiting_rx) = flume::unbounded();
    let store = LocalStore::open_with_gate(cfg, Some(Gate { open, waiting })).unwrap();
    (store, open_tx, waiting_rx)
}

#[test]
fn in_flight_entries_are_never_swept_by_the_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let (mut s, gate, _) = gated(dir.path(), 1, Duration::ZERO, Duration::from_secs(5));
    assert_eq!(s.exists(&keys(1), true).unwrap(), 1);
    assert_eq!(s.stats().promotions_started, 1);
    // TTL 0 would sweep every finished entry; the in-flight one must stay, so the
    // second hint is deduplicated rather than dispatched twice.
    s.exists(&keys(1), true).unwrap();
    assert_eq!(s.stats().promotions_started, 1);
    assert_eq!(s.stats().hints_deduplicated, 1);
    gate.send(()).unwrap();
    let mut buf = vec![0u8; 64];
    assert_eq!(s.get(&keys(1), &mut [&mut buf[..]]).unwrap(), [true]);
    assert_eq!(buf, payload(0));
}

#[test]
fn a_batch_get_waits_once_for_all_its_promotions() {
    let dir = tempfile::tempdir().unwrap();
    let (mut s, gate, waiting) = gated(
        dir.path(),
        4,
        Duration::from_secs(60),
        Duration::from_secs(10),
    );
    assert_eq!(s.exists(&keys(4), true).unwrap(), 4);
    // The gate opens only once the get is waiting: no promotion can land before.
    let opener = std::thread::spawn(move || {
        waiting.recv().expect("the get waits");
        for _ in 0..4 {
            gate.send(()).expect("the workers hold the gate");
        }
    });
    let mut bufs = vec![vec![0xffu8; 64]; 4];
    let mut views: Vec<&mut [u8]> = bufs.iter_mut().map(Vec::as_mut_slice).collect();
    let got = s.get(&keys(4), &mut views).unwrap();
    opener.join().unwrap();
    assert_eq!(got, [true; 4]);
    assert_eq!(
        s.stats().get_waits,
        1,
        "one wait for the whole batch, not one per key"
    );
    assert_eq!(
        s.stats().memory_objects,
        4,
        "the promotions landed in memory"
    );
    for (i, b) in bufs.iter().enumerate() {
        assert_eq!(b, &payload(i));
    }
}

#[test]
fn promotions_not_done_by_the_deadline_are_read_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let (mut s, _gate, _) = gated(
        dir.path(),
        2,
        Duration::from_secs(60),
        Duration::from_millis(10),
    );
    s.exists(&keys(2), true).unwrap();
    let mut a = [9u8; 64];
    let mut b = [9u8; 64];
    let got = s.get(&keys(2), &mut [&mut a[..], &mut b[..]]).unwrap();
    assert_eq!(
        got,
        [true, true],
        "a stored object is never a miss for being slow"
    );
    assert_eq!(
        (a.to_vec(), b.to_vec()),
        (payload(0), payload(1)),
        "read from disk, past the promotions"
    );
    assert_eq!(s.stats().get_waits, 1, "waited once, for the whole batch");
}

/// Review bug of reference 002: a hint whose registration failed (full queue) left a
/// throttle entry that blocked every later hint for that key. Here a dropped hint
/// leaves nothing behind, so every key is promoted exactly once over two rounds,
/// however the worker races with the queue.
#[test]
fn a_dropped_hint_leaves_no_throttle_entry() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LocalStoreConfig {
        prefetch_workers: 1,
        prefetch_queue: 1,
        prefetch_ttl: Duration::from_secs(60),
        get_deadline: Duration::from_secs(10),
        ..LocalStoreConfig::new(dir.path(), 1 << 20, 1 << 20)
    };
    {
        let mut s = LocalStore::open(cfg.clone()).unwrap();
        let payloads: Vec<Vec<u8>> = (0..4).map(payload).collect();
        let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        s.put(&keys(4), &refs).unwrap();
    }
    let (gate_tx, open) = flume::unbounded();
    let (waiting, _) = flume::unbounded();
    let mut s = LocalStore::open_with_gate(cfg, Some(Gate { open, waiting })).unwrap();
    // The worker takes one job and waits at the closed gate; the one-slot queue then
    // holds one more: at least two of the four hints are dropped.
    s.exists(&keys(4), true).unwrap();
    let first = s.stats().promotions_started;
    assert!(
        first <= 2,
        "the one-slot queue dropped some hints ({first} started)"
    );
    for _ in 0..8 {
        gate_tx.send(()).unwrap();
    }
    let mut bufs = vec![vec![0u8; 64]; 4];
    let mut views: Vec<&mut [u8]> = bufs.iter_mut().map(Vec::as_mut_slice).collect();
    assert_eq!(s.get(&keys(4), &mut views).unwrap(), [true; 4]);
    assert_eq!(bufs, (0..4).map(payload).collect::<Vec<_>>());
    // Second round: only the keys whose hints were dropped are promoted now.
    for (i, key) in keys(4).into_iter().enumerate() {
        s.exists(std::slice::from_ref(&key), true).unwrap();
        let mut buf = [0u8; 64];
        let got = s.get(std::slice::from_ref(&key), &mut [&mut buf[..]]);
        assert_eq!(got.unwrap(), [true]);
        assert_eq!(buf.to_vec(), payload(i));
    }
    assert_eq!(
        s.stats().promotions_started,
        4,
        "each key promoted exactly once"
    );
    assert_eq!(s.stats().memory_objects, 4);
}
