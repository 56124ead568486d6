//! The embedded L3 store's contract.

use kvtier_l3::{L3Backend, L3Key, LocalStore, LocalStoreConfig, Namespace, PutOutcome};
use kvtier_types::hash::PageHash;

fn ns() -> Namespace {
    Namespace::new("test-model", "bf16", "page-first", 16, 1, 0).expect("namespace")
}

fn keys(n: u8) -> Vec<L3Key> {
    (0..n).map(|i| ns().key(&PageHash([i; 32]))).collect()
}

fn page(i: u8) -> Vec<u8> {
    (0..256)
        .map(|j| (j as u8).wrapping_mul(31).wrapping_add(i))
        .collect()
}

/// A store whose batch gets wait up to 10 s for promotions in flight (they return as
/// soon as the promotions land; the long deadline keeps the tests independent of the
/// machine's load).
fn store(dir: &std::path::Path, memory: u64, disk: u64) -> LocalStore {
    let cfg = LocalStoreConfig {
        get_deadline: std::time::Duration::from_secs(10),
        ..LocalStoreConfig::new(dir, memory, disk)
    };
    LocalStore::open(cfg).expect("open")
}

fn put_pages(s: &mut LocalStore, n: u8) -> Vec<PutOutcome> {
    let pages: Vec<Vec<u8>> = (0..n).map(page).collect();
    let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
    s.put(&keys(n), &refs).expect("put")
}

fn get_pages(s: &mut LocalStore, keys: &[L3Key]) -> (Vec<bool>, Vec<Vec<u8>>) {
    let mut bufs = vec![vec![0u8; 256]; keys.len()];
    let mut views: Vec<&mut [u8]> = bufs.iter_mut().map(Vec::as_mut_slice).collect();
    let hits = s.get(keys, &mut views).expect("get");
    (hits, bufs)
}

#[test]
fn put_get_round_trip_and_write_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = store(dir.path(), 1 << 20, 1 << 20);
    assert_eq!(put_pages(&mut s, 3), [PutOutcome::Stored; 3]);
    let (hits, bufs) = get_pages(&mut s, &keys(3));
    assert_eq!(hits, [true; 3]);
    assert_eq!(bufs, (0..3).map(page).collect::<Vec<_>>());
    // Write-once: a second put of a key keeps the first object.
    let other = vec![0xeeu8; 256];
    assert_eq!(
        s.put(&keys(1), &[&other[..]]).expect("put"),
        [PutOutcome::AlreadyPresent]
    );
    assert_eq!(get_pages(&mut s, &keys(1)).1[0], page(0));
}

#[test]
fn exists_counts_consecutive_hits_from_the_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = store(dir.path(), 1 << 20, 1 << 20);
    put_pages(&mut s, 4);
    assert_eq!(s.exists(&keys(4), false).expect("exists"), 4);
    s.remove(&keys(2)[1..2]).expect("remove");
    assert_eq!(
        s.exists(&keys(4), false).expect("exists"),
        1,
        "a gap ends the run"
    );
    assert_eq!(s.exists(&[], false).expect("exists"), 0);
}

#[test]
fn objects_survive_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    put_pages(&mut store(dir.path(), 1 << 20, 1 << 20), 3);
    let mut s = store(dir.path(), 1 << 20, 1 << 20);
    assert_eq!(s.stats().disk_objects, 3);
    assert_eq!(s.stats().memory_objects, 0);
    let (hits, bufs) = get_pages(&mut s, &keys(3));
    assert_eq!(hits, [true; 3]);
    assert_eq!(bufs[2], page(2));
}

/// Flips the last byte of every object's payload in the store's segment files.
fn corrupt_every_object(dir: &std::path::Path) {
    for (path, payload) in kvtier_l3::payload_extents(dir).expect("segments") {
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[payload.end as usize - 1] ^= 0x55;
        std::fs::write(&path, bytes).expect("write");
    }
}

#[test]
fn a_corrupt_object_reads_as_a_miss_never_as_kv() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Memory tier too small for any object: every get reads the disk.
    let mut s = store(dir.path(), 0, 1 << 20);
    put_pages(&mut s, 2);
    corrupt_every_object(dir.path());
    let (hits, bufs) = get_pages(&mut s, &keys(2));
    assert_eq!(hits, [false, false]);
    assert!(
        bufs.iter().all(|b| b.iter().all(|&x| x == 0)),
        "buffers untouched"
    );
    assert_eq!(s.stats().corrupt_objects, 2);
    assert_eq!(
        s.exists(&keys(2), false).expect("exists"),
        0,
        "corrupt objects are dropped"
    );
}

#[test]
fn corrupt_objects_are_dropped_at_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    put_pages(&mut store(dir.path(), 1 << 20, 1 << 20), 2);
    corrupt_every_object(dir.path());
    let s = store(dir.path(), 1 << 20, 1 << 20);
    assert_eq!(s.stats().disk_objects, 0);
    assert_eq!(s.stats().corrupt_objects, 2);
}

#[test]
fn memory_and_disk_are_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Memory for 2 objects, disk for 3.
    let mut s = store(dir.path(), 512, 768);
    put_pages(&mut s, 4);
    let stats = s.stats();
    // Puts go to the log only (the page cache holds what was just written).
    assert_eq!((stats.memory_objects, stats.disk_objects), (0, 3));
    assert!(stats.disk_bytes <= 768);
    // The oldest object is gone; the others still read back whole.
    let (hits, bufs) = get_pages(&mut s, &keys(4));
    assert_eq!(hits, [false, true, true, true]);
    assert_eq!(bufs[1], page(1));
    // Promotions fill memory up to its bound.
    assert_eq!(s.exists(&keys(4)[1..], true).expect("exists"), 3);
    let (hits, _) = get_pages(&mut s, &keys(4)[1..]);
    assert_eq!(hits, [true; 3]);
    let stats = s.stats();
    assert_eq!(stats.memory_objects, 2);
    assert!(stats.memory_bytes <= 512);
}

#[test]
fn prefetch_on_exist_promotes_disk_objects_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    put_pages(&mut store(dir.path(), 1 << 20, 1 << 20), 3);
    let mut s = store(dir.path(), 1 << 20, 1 << 20);
    assert!(s.capabilities().prefetch_on_exist);
    assert_eq!(s.exists(&keys(3), true).expect("exists"), 3);
    assert_eq!(s.stats().promotions_started, 3);
    s.exists(&keys(3), true).expect("exists");
    assert_eq!(
        s.stats().promotions_started,
        3,
        "no second promotion within the TTL"
    );
    // Still in flight (deduplicated hints) or already landed (keys in memory), depending
    // on the workers' pace: either way none starts twice. The exact dedup count is
    // checked with gated workers in the unit tests.
    let (hits, bufs) = get_pages(&mut s, &keys(3));
    assert_eq!(hits, [true; 3]);
    assert_eq!(bufs[0], page(0));
    assert_eq!(s.stats().memory_objects, 3);
}

#[test]
fn a_failed_promotion_clears_its_entry() {
    let dir = tempfile::tempdir().expect("tempdir");
    put_pages(&mut store(dir.path(), 1 << 20, 1 << 20), 1);
    let mut s = store(dir.path(), 1 << 20, 1 << 20);
    corrupt_every_object(dir.path());
    s.exists(&keys(1), true).expect("exists");
    // The get waits for the promotion, which fails; the object then reads as a miss.
    let (hits, _) = get_pages(&mut s, &keys(1));
    assert_eq!(hits, [false]);
    assert_eq!(s.stats().promotions_failed, 1);
    assert_eq!(s.stats().hints_deduplicated, 0);
}

#[test]
fn mismatched_batches_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = store(dir.path(), 1 << 20, 1 << 20);
    assert!(s.put(&keys(2), &[&[0u8; 4][..]]).is_err());
    let mut buf = [0u8; 4];
    assert!(s.get(&keys(2), &mut [&mut buf[..]]).is_err());
}

/// A store that takes only the first `taken` objects of every put, then fails.
#[derive(Debug)]
struct TakesOnly(usize);

impl kvtier_l3::L3Faults for TakesOnly {
    fn before_put(&mut self, _keys: &[L3Key]) -> Result<usize, kvtier_l3::L3Error> {
        Ok(self.0)
    }
}

/// A backup is all or nothing: one that fails part-way takes back what it stored, so
/// nothing of it can be served later; objects earlier backups stored stay.
#[test]
fn a_failed_backup_leaves_none_of_its_objects() {
    use kvtier_host::HostArena;
    use kvtier_l3::L3Core;
    use kvtier_types::{BackupOp, EngineEvent};
    use std::sync::Arc;

    let dir = tempfile::tempdir().expect("tempdir");
    let arena = Arc::new(HostArena::new(8, 256).expect("arena"));
    {
        let mut pages = arena.write(&[1, 2, 3, 4]).expect("pages");
        for (i, page) in pages.slices_mut().into_iter().enumerate() {
            page.copy_from_slice(&self::page(i as u8));
        }
    }
    let backup = |op_id, pages: Vec<u32>, hashes: Vec<u8>| BackupOp {
        op_id,
        src_pages: pages,
        page_hashes: hashes.into_iter().map(|i| PageHash([i; 32])).collect(),
        states: Vec::new(),
    };
    let mut l3 = L3Core::new(
        Box::new(store(dir.path(), 1 << 20, 1 << 20)),
        ns(),
        16,
        arena,
    )
    .expect("L3 core");
    // An earlier backup stores object 0 whole.
    let events = l3.transfer(&[], &[backup(1, vec![1], vec![0])]);
    assert_eq!(
        events,
        [EngineEvent::BackupDone {
            op_id: 1,
            success: true
        }]
    );
    // The next one takes objects 0 (present) and 1, then fails on 2 and 3.
    let mut l3 = l3.with_faults(Box::new(TakesOnly(2)));
    let events = l3.transfer(&[], &[backup(2, vec![1, 2, 3, 4], vec![0, 1, 2, 3])]);
    assert_eq!(
        events,
        [EngineEvent::BackupDone {
            op_id: 2,
            success: false
        }]
    );
    let stats = l3.stats();
    assert_eq!((stats.failed_backups, stats.unremoved_objects), (1, 0));
    let all = keys(4);
    assert_eq!(
        l3.backend_mut().exists(&all[..1], false).expect("exists"),
        1
    );
    for key in &all[1..] {
        let held = l3.backend_mut().exists(std::slice::from_ref(key), false);
        assert_eq!(held.expect("exists"), 0, "{key:?} was taken back");
    }
}

/// The segment log: what a restart finds is what was there — removed objects stay
/// removed (tombstones), and a torn last record loses only itself.
#[test]
fn removals_survive_a_restart_and_a_torn_tail_loses_only_itself() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut s = store(dir.path(), 0, 1 << 20);
        put_pages(&mut s, 4);
        assert_eq!(s.remove(&keys(4)[1..2]).expect("remove"), 1);
    }
    let mut s = store(dir.path(), 0, 1 << 20);
    let (hits, bufs) = get_pages(&mut s, &keys(4));
    assert_eq!(
        hits,
        [true, false, true, true],
        "the removed object stays removed"
    );
    assert_eq!(bufs[3], page(3));
    drop(s);
    // A store whose last record is torn (cut inside its payload, as by a crash
    // mid-write) keeps every record before it.
    let dir = tempfile::tempdir().expect("tempdir");
    put_pages(&mut store(dir.path(), 0, 1 << 20), 4);
    let (path, payload) = kvtier_l3::payload_extents(dir.path())
        .expect("segments")
        .into_iter()
        .last()
        .expect("objects");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open segment");
    file.set_len(payload.start + 10).expect("truncate");
    let mut s = store(dir.path(), 0, 1 << 20);
    let (hits, bufs) = get_pages(&mut s, &keys(4));
    assert_eq!(hits, [true, true, true, false]);
    assert_eq!(bufs[2], page(2));
}

/// Dead records are reclaimed: a long run of puts through a small disk bound keeps the
/// segment files near the bound (compaction copies the live objects forward), and what
/// is live reads back whole, before and after a restart.
#[test]
fn the_log_stays_near_its_bound_and_compaction_keeps_live_objects() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = LocalStoreConfig {
        segment_bytes: 4096,
        ..LocalStoreConfig::new(dir.path(), 0, 8 * 256)
    };
    let key = |i: u32| {
        let mut hash = [0u8; 32];
        hash[..4].copy_from_slice(&i.to_le_bytes());
        ns().key(&PageHash(hash))
    };
    let page_of = |i: u32| vec![(i % 251) as u8 + 1; 256];
    let mut s = LocalStore::open(cfg.clone()).expect("open");
    for i in 0..400u32 {
        let p = page_of(i);
        s.put(&[key(i)], &[&p[..]]).expect("put");
    }
    let files: u64 = std::fs::read_dir(dir.path())
        .expect("dir")
        .flatten()
        .map(|e| e.metadata().expect("meta").len())
        .sum();
    assert!(
        files <= 3 * 8 * 256 + 2 * 4096,
        "segment files hold {files} bytes"
    );
    let check = |s: &mut LocalStore| {
        for i in 392..400u32 {
            let mut buf = vec![0u8; 256];
            assert_eq!(
                s.get(&[key(i)], &mut [&mut buf[..]]).expect("get"),
                [true],
                "{i}"
            );
            assert_eq!(buf, page_of(i));
        }
        assert_eq!(s.stats().disk_objects, 8);
    };
    check(&mut s);
    drop(s);
    let mut s = LocalStore::open(cfg).expect("reopen");
    check(&mut s);
}

/// A batch larger than a few write chunks (its checksums summed on a helper thread
/// while earlier chunks are written) stores every object, in order, whole: each reads
/// back after a restart, and a flipped byte in any of them is still caught.
#[test]
fn a_large_batch_is_stored_whole_and_survives_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (n, size) = (40u8, 512 << 10); // 20 MiB: five chunks
    let pages: Vec<Vec<u8>> = (0..n)
        .map(|i| (0..size).map(|j| (j as u8).wrapping_mul(13) ^ i).collect())
        .collect();
    let refs: Vec<&[u8]> = pages.iter().map(Vec::as_slice).collect();
    let mut s = store(dir.path(), 0, 1 << 30);
    assert_eq!(
        s.put(&keys(n), &refs).expect("put"),
        vec![PutOutcome::Stored; n as usize]
    );
    drop(s);
    let mut s = store(dir.path(), 0, 1 << 30);
    let mut bufs = vec![vec![0u8; size]; n as usize];
    let mut views: Vec<&mut [u8]> = bufs.iter_mut().map(Vec::as_mut_slice).collect();
    assert_eq!(
        s.get(&keys(n), &mut views).expect("get"),
        vec![true; n as usize]
    );
    assert_eq!(bufs, pages);
    drop(s);
    corrupt_every_object(dir.path());
    let s = store(dir.path(), 0, 1 << 30);
    assert_eq!(s.stats().disk_objects, 0);
    assert_eq!(s.stats().corrupt_objects, u64::from(n));
}
