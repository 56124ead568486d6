//! `kvtier bench l3`: prefetch and backup throughput through the L3 store actor, against
//! the raw backend's batch get and put of the same pages, in the same run.
//!
//! Two stores of the same kind (two `LocalStore` directories, or two Mooncake clients of
//! one cluster), each over its own host arena of identical pages:
//! * **raw**: `put(keys, pages)` and `get(keys, pages)` called on the backend directly,
//!   with the keys formatted beforehand;
//! * **actor**: one `BackupOp` and one `PrefetchOp` of the same page count sent as
//!   `L3Transfer` messages to an L3 actor on its own thread (`kvtier::L3Service`), timed
//!   from the send to the reply, so the thread hop, key formatting, arena borrows and
//!   event building count.
//!
//! Objects are write-once, so every round uses fresh page hashes on both sides. Rounds
//! alternate raw and actor; the figures are medians over rounds. For the local store,
//! each round also appends the same bytes to one plain file and reads them back, the
//! yardstick a store on this disk is held to.

use std::sync::Arc;
use std::time::Instant;

use kvtier::L3Service;
use kvtier_device::bench::median;
use kvtier_host::HostArena;
use kvtier_l3::{
    L3Backend, L3Core, L3Key, LocalStore, LocalStoreConfig, MooncakeConfig, MooncakeStore,
    Namespace, PutOutcome,
};
use kvtier_types::hash::PageHash;
use kvtier_types::{BackupOp, EngineEvent, PageId, PrefetchOp, RequestId};
use serde::Serialize;

use crate::scenario::{L3Store, ScenarioError, mooncake_cluster, scratch_dir};

/// What to measure.
#[derive(Debug, Clone)]
pub struct L3BenchOptions {
    /// `Local` or `Mooncake` (the cluster `mooncake` names, else the environment's).
    pub store: L3Store,
    /// Page sizes in KiB.
    pub page_kib: Vec<u32>,
    /// Bytes moved per batch (one op), per page size.
    pub batch_bytes: u64,
    /// Rounds per page size (each: raw put, actor backup, raw get, actor prefetch).
    pub rounds: usize,
    /// `Mooncake`: the cluster.
    pub mooncake: Option<MooncakeConfig>,
}

impl L3BenchOptions {
    /// 16, 64 and 256 KiB pages, 32 MiB batches (a 512-page prefetch of 64 KiB pages),
    /// 11 rounds.
    pub fn new(store: L3Store) -> Self {
        Self {
            store,
            page_kib: vec![16, 64, 256],
            batch_bytes: 32 << 20,
            rounds: 11,
            mooncake: None,
        }
    }
}

/// Medians for one page size: throughputs in GB/s, and the actor's share of the raw
/// store's throughput as the median of each round's ratio (the two sides of a round
/// run back to back, so the disk's slow drifts cancel).
#[derive(Debug, Clone, Serialize)]
pub struct L3BenchRow {
    /// Page size, KiB.
    pub page_kib: u32,
    /// Pages per batch.
    pub pages: u32,
    /// Raw backend put.
    pub raw_put_gbps: f64,
    /// Backup through the actor.
    pub actor_backup_gbps: f64,
    /// Raw backend get.
    pub raw_get_gbps: f64,
    /// Prefetch through the actor.
    pub actor_prefetch_gbps: f64,
    /// Backup through the actor over raw put.
    pub backup_ratio: f64,
    /// The same bytes written as one plain sequential file in the same run (`local`
    /// only; 0 otherwise).
    pub plain_write_gbps: f64,
    /// Raw put over the plain write, the median of each round's ratio.
    pub put_vs_plain: f64,
    /// The same bytes read back from that file, page by page (`local` only; 0
    /// otherwise).
    pub plain_read_gbps: f64,
    /// Raw get over the plain read, the median of each round's ratio.
    pub get_vs_plain: f64,
    /// Prefetch through the actor over raw get.
    pub prefetch_ratio: f64,
}

/// The bench's result.
#[derive(Debug, Clone, Serialize)]
pub struct L3BenchReport {
    /// `local` or `mooncake`.
    pub store: String,
    /// Rounds per page size.
    pub rounds: usize,
    /// One row per page size.
    pub rows: Vec<L3BenchRow>,
}

/// The plain baseline: one file the run appends every batch to and reads every batch
/// back from, page by page, as a simple program would, beside the store's segments (so
/// both meet the same page cache and the same write-back of dirty pages).
struct PlainFile {
    file: std::fs::File,
    path: std::path::PathBuf,
    /// Where the last batch written begins.
    last: u64,
    len: u64,
}

impl PlainFile {
    fn create(path: std::path::PathBuf) -> Result<Self, ScenarioError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| ScenarioError::L3(format!("{}: {e}", path.display())))?;
        Ok(Self {
            file,
            path,
            last: 0,
            len: 0,
        })
    }

    fn io(&self, e: std::io::Error) -> ScenarioError {
        ScenarioError::L3(format!("{}: {e}", self.path.display()))
    }

    /// Appends the batch's pages; its GB/s.
    fn write(
        &mut self,
        arena: &HostArena,
        pages: &[PageId],
        batch: u64,
    ) -> Result<f64, ScenarioError> {
        use std::io::Write;
        let read = arena.read(pages).map_err(arena_error)?;
        let t = Instant::now();
        for page in read.slices() {
            self.file.write_all(page).map_err(|e| self.io(e))?;
        }
        let rate = gbps(batch, t.elapsed().as_secs_f64());
        (self.last, self.len) = (self.len, self.len + batch);
        Ok(rate)
    }

    /// Reads the last batch written back into the pages; its GB/s.
    fn read(&self, arena: &HostArena, pages: &[PageId], batch: u64) -> Result<f64, ScenarioError> {
        use std::os::unix::fs::FileExt;
        let mut write = arena.write(pages).map_err(arena_error)?;
        let t = Instant::now();
        let mut at = self.last;
        for page in write.slices_mut() {
            self.file.read_exact_at(page, at).map_err(|e| self.io(e))?;
            at += page.len() as u64;
        }
        Ok(gbps(batch, t.elapsed().as_secs_f64()))
    }
}

/// A store of the bench's kind over `arena`; the scratch directory must outlive it.
fn open_store(
    o: &L3BenchOptions,
    arena: &HostArena,
    scratch: &mut Vec<tempfile::TempDir>,
) -> Result<Box<dyn L3Backend>, ScenarioError> {
    match o.store {
        L3Store::Local => {
            let dir = scratch_dir("bench-l3")?;
            // Memory holds a few batches; the rest is on disk. Both sides alike.
            let store = LocalStore::open(LocalStoreConfig::new(
                dir.path(),
                4 * o.batch_bytes,
                64 * o.batch_bytes * o.rounds as u64,
            ))?;
            scratch.push(dir);
            Ok(Box::new(store))
        }
        L3Store::Mooncake => {
            let config = mooncake_cluster(o.mooncake.as_ref())?;
            // Objects stay until the cluster evicts them (silently): each client
            // contributes room for everything the bench writes, so none is evicted.
            let written = o.batch_bytes * o.rounds as u64 * o.page_kib.len() as u64 * 2;
            let config = MooncakeConfig {
                global_segment_bytes: config.global_segment_bytes.max(written),
                ..config
            };
            let mut store = MooncakeStore::connect(&config)?;
            store.register_arena(arena)?;
            Ok(Box::new(store))
        }
        L3Store::Off => Err(ScenarioError::L3("bench l3 needs a store".into())),
    }
}

/// Page hashes no earlier round (or run: Mooncake keeps objects) used.
fn fresh_hashes(run: u64, round: u64, side: u8, pages: u32) -> Vec<PageHash> {
    (0..pages)
        .map(|i| {
            let mut h = [0u8; 32];
            h[..8].copy_from_slice(&run.to_le_bytes());
            h[8..16].copy_from_slice(&round.to_le_bytes());
            h[16] = side;
            h[20..24].copy_from_slice(&i.to_le_bytes());
            PageHash(h)
        })
        .collect()
}

#[derive(Debug, Clone, Copy)]
enum Side {
    Raw,
    Actor,
}

fn gbps(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / seconds / 1e9
}

/// Byte `j` of the `i`-th page of a batch: differs per page and per position.
fn pattern(i: usize, j: usize) -> u8 {
    (i as u8).wrapping_mul(31).wrapping_add(j as u8)
}

/// Writes the pattern into the pages.
fn fill(arena: &HostArena, pages: &[PageId]) -> Result<(), ScenarioError> {
    let mut w = arena.write(pages).map_err(arena_error)?;
    for (i, page) in w.slices_mut().into_iter().enumerate() {
        for (j, b) in page.iter_mut().enumerate() {
            *b = pattern(i, j);
        }
    }
    Ok(())
}

/// Runs the bench.
pub fn run_l3_bench(o: &L3BenchOptions) -> Result<L3BenchReport, ScenarioError> {
    if o.rounds == 0 || o.page_kib.is_empty() || o.batch_bytes == 0 {
        return Err(ScenarioError::L3(
            "bench l3 needs rounds, page sizes and a batch size".into(),
        ));
    }
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let rows = o
        .page_kib
        .iter()
        .map(|&kib| measure_page_size(o, kib, run))
        .collect::<Result<Vec<_>, _>>();
    Ok(L3BenchReport {
        store: o.store.name().to_string(),
        rounds: o.rounds,
        rows: rows?,
    })
}

fn arena_error(e: kvtier_host::HostError) -> ScenarioError {
    ScenarioError::L3(e.to_string())
}

/// Zeroes the pages (before a get, so a get that writes nothing cannot pass).
fn zero(arena: &HostArena, pages: &[PageId]) -> Result<(), ScenarioError> {
    let mut w = arena.write(pages).map_err(arena_error)?;
    for page in w.slices_mut() {
        page.fill(0);
    }
    Ok(())
}

/// Whether every page holds what `fill` wrote.
fn intact(arena: &HostArena, pages: &[PageId]) -> Result<bool, ScenarioError> {
    let read = arena.read(pages).map_err(arena_error)?;
    Ok(read
        .slices()
        .iter()
        .enumerate()
        .all(|(i, page)| page.iter().enumerate().all(|(j, &b)| b == pattern(i, j))))
}

fn measure_page_size(o: &L3BenchOptions, kib: u32, run: u64) -> Result<L3BenchRow, ScenarioError> {
    let page_bytes = u64::from(kib) << 10;
    let pages = u32::try_from((o.batch_bytes / page_bytes).max(1))
        .map_err(|_| ScenarioError::L3("batch too large".into()))?;
    let batch = u64::from(pages) * page_bytes;
    // Page 0 is reserved; pages 1..=n are the batch.
    let ids: Vec<PageId> = (1..=pages).collect();
    let raw_arena = HostArena::new(pages + 1, page_bytes).map_err(arena_error)?;
    let actor_arena = Arc::new(HostArena::new(pages + 1, page_bytes).map_err(arena_error)?);
    fill(&raw_arena, &ids)?;
    fill(&actor_arena, &ids)?;
    // Declared first, dropped last: the stores' directories.
    let mut scratch = Vec::new();
    let mut raw = open_store(o, &raw_arena, &mut scratch)?;
    let namespace = Namespace::new("kvtier-bench-l3", "u8", "page-first", kib, 1, 0)?;
    let core = L3Core::new(
        open_store(o, &actor_arena, &mut scratch)?,
        namespace.clone(),
        1,
        actor_arena.clone(),
    )?;
    let actor = L3Service::start(core)?;
    let mut samples = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    // The same bytes through one plain file, beside the local store's files.
    let plain_dir = match o.store {
        L3Store::Local => Some(scratch_dir("bench-l3-plain")?),
        _ => None,
    };
    let mut plain_file = match &plain_dir {
        Some(dir) => Some(PlainFile::create(dir.path().join("plain.log"))?),
        None => None,
    };
    let (mut plain, mut plain_reads) = (Vec::new(), Vec::new());
    for round in 0..o.rounds as u64 {
        // Fresh keys each round (objects are write-once); the raw side's are formatted
        // beforehand, the actor formats its own from the ops' hashes.
        let keys: Vec<L3Key> = namespace.keys(&fresh_hashes(run, round, 0, pages));
        let hashes = fresh_hashes(run, round, 1, pages);
        // Odd rounds run the actor first, so neither side always follows the other.
        let order = if round % 2 == 0 {
            [Side::Raw, Side::Actor]
        } else {
            [Side::Actor, Side::Raw]
        };
        for side in order {
            let t = Instant::now();
            match side {
                Side::Raw => {
                    let put = {
                        let read = raw_arena.read(&ids).map_err(arena_error)?;
                        raw.put(&keys, &read.slices())?
                    };
                    samples[0].push(gbps(batch, t.elapsed().as_secs_f64()));
                    if put.iter().any(|p| *p != PutOutcome::Stored) {
                        return Err(ScenarioError::L3("raw put did not store every page".into()));
                    }
                }
                Side::Actor => {
                    let backup = BackupOp {
                        op_id: 1,
                        src_pages: ids.clone(),
                        page_hashes: hashes.clone(),
                        states: Vec::new(),
                    };
                    let events = actor.transfer(Vec::new(), vec![backup])?;
                    samples[1].push(gbps(batch, t.elapsed().as_secs_f64()));
                    if !matches!(
                        events.as_slice(),
                        [EngineEvent::BackupDone { success: true, .. }]
                    ) {
                        return Err(ScenarioError::L3(format!("backup failed: {events:?}")));
                    }
                }
            }
        }
        if let Some(file) = &mut plain_file {
            plain.push(file.write(&raw_arena, &ids, batch)?);
        }
        // The last round's gets land in zeroed pages and are checked, so a get that
        // writes nothing or the wrong bytes cannot pass. (Not every round: touching the
        // actor's pages from this thread would bill it for moving them between cores.)
        let last = round + 1 == o.rounds as u64;
        if last {
            zero(&raw_arena, &ids)?;
            zero(&actor_arena, &ids)?;
        }
        for side in order {
            let t = Instant::now();
            match side {
                Side::Raw => {
                    let hits = {
                        let mut write = raw_arena.write(&ids).map_err(arena_error)?;
                        raw.get(&keys, &mut write.slices_mut())?
                    };
                    samples[2].push(gbps(batch, t.elapsed().as_secs_f64()));
                    if hits.iter().any(|hit| !hit) {
                        return Err(ScenarioError::L3(format!(
                            "raw get missed {} of {pages} pages in round {round}",
                            hits.iter().filter(|hit| !**hit).count()
                        )));
                    }
                }
                Side::Actor => {
                    let prefetch = PrefetchOp {
                        op_id: 2,
                        request_id: RequestId::from("bench"),
                        dst_pages: ids.clone(),
                        page_hashes: hashes.clone(),
                        state: None,
                    };
                    let events = actor.transfer(vec![prefetch], Vec::new())?;
                    samples[3].push(gbps(batch, t.elapsed().as_secs_f64()));
                    let complete = matches!(
                        events.as_slice(),
                        [EngineEvent::PrefetchDone { success: true, completed_pages, .. }]
                            if *completed_pages == pages
                    );
                    if !complete {
                        return Err(ScenarioError::L3(format!(
                            "prefetch incomplete: {events:?}"
                        )));
                    }
                }
            }
        }
        if last && (!intact(&raw_arena, &ids)? || !intact(&actor_arena, &ids)?) {
            return Err(ScenarioError::L3("a get returned different bytes".into()));
        }
        if let Some(file) = &plain_file {
            plain_reads.push(file.read(&raw_arena, &ids, batch)?);
        }
    }
    let [raw_put, actor_backup, raw_get, actor_prefetch] = samples;
    let ratios =
        |actor: &[f64], raw: &[f64]| median(actor.iter().zip(raw).map(|(a, r)| a / r).collect());
    let (plain_write_gbps, put_vs_plain, plain_read_gbps, get_vs_plain) = if plain.is_empty() {
        (0.0, 0.0, 0.0, 0.0)
    } else {
        let (put_vs, get_vs) = (ratios(&raw_put, &plain), ratios(&raw_get, &plain_reads));
        (median(plain), put_vs, median(plain_reads), get_vs)
    };
    Ok(L3BenchRow {
        page_kib: kib,
        pages,
        plain_write_gbps,
        put_vs_plain,
        plain_read_gbps,
        get_vs_plain,
        backup_ratio: ratios(&actor_backup, &raw_put),
        prefetch_ratio: ratios(&actor_prefetch, &raw_get),
        raw_put_gbps: median(raw_put),
        actor_backup_gbps: median(actor_backup),
        raw_get_gbps: median(raw_get),
        actor_prefetch_gbps: median(actor_prefetch),
    })
}
