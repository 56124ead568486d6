//! `LocalStore`: the embedded L3 store.
//!
//! A bounded memory tier over a bounded disk tier: an append-only log of segment files
//! (`segments`), which a restart replays, so the store survives without a separate
//! index. Objects are write-once and checksummed: a corrupt object reads as a miss and
//! is dropped.
//!
//! Prefetch-on-exist (reference 001/002): an existence query with the
//! `prefetch_to_memory` hint sends disk-only hits to a bounded pool of worker threads,
//! which read and verify them and send the payloads back over a channel. The store drains
//! that channel before every call, so its state has one owner. Duplicate hints for a key
//! promoted within the TTL are dropped, but an entry is never swept while in flight; a
//! failed promotion clears its entry; a batch get waits for in-flight promotions with one
//! deadline for the whole batch, blocking on the channel, never polling key by key.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::backend::{Capabilities, L3Backend, L3Stats, PutOutcome, check_batch};
use crate::segments::{self, Extent, Record, Segments};
use crate::{L3Error, L3Key, codec};

/// Sizes and timings of a `LocalStore`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalStoreConfig {
    /// Directory of the disk tier (created if missing).
    pub dir: PathBuf,
    /// Bytes of payload the memory tier may hold.
    pub memory_bytes: u64,
    /// Bytes of payload the disk tier may hold.
    pub disk_bytes: u64,
    /// Worker threads promoting disk objects to memory.
    pub prefetch_workers: usize,
    /// Promotions queued at most; further hints are dropped (a hint is only a hint).
    pub prefetch_queue: usize,
    /// A key promoted less than this long ago is not promoted again.
    pub prefetch_ttl: Duration,
    /// How long a batch get waits, in all, for promotions in flight.
    pub get_deadline: Duration,
    /// A segment file is closed once it holds this many bytes.
    pub segment_bytes: u64,
}

impl LocalStoreConfig {
    /// A config with the given directory and bounds, and default timings.
    pub fn new(dir: impl Into<PathBuf>, memory_bytes: u64, disk_bytes: u64) -> Self {
        Self {
            dir: dir.into(),
            memory_bytes,
            disk_bytes,
            prefetch_workers: 2,
            prefetch_queue: 1024,
            prefetch_ttl: Duration::from_secs(10),
            get_deadline: Duration::from_millis(50),
            segment_bytes: 64 << 20,
        }
    }
}

#[derive(Debug)]
enum Promotion {
    InFlight,
    Done(Instant),
}

struct Job {
    key: L3Key,
    path: PathBuf,
    offset: u64,
    size: u32,
}

type JobResult = (L3Key, Option<Vec<u8>>);

/// The embedded L3 store.
#[derive(Debug)]
pub struct LocalStore {
    cfg: LocalStoreConfig,
    /// Memory tier: key → payload, with LRU ticks.
    memory: HashMap<L3Key, (Vec<u8>, u64)>,
    memory_lru: BTreeMap<u64, L3Key>,
    memory_used: u64,
    /// Disk tier: key → payload length, LRU tick, and where its envelope lies.
    disk: HashMap<L3Key, (u64, u64, Extent)>,
    log: Segments,
    disk_lru: BTreeMap<u64, L3Key>,
    disk_used: u64,
    tick: u64,
    promotions: HashMap<L3Key, Promotion>,
    /// Finished promotions in the order they finished, for the throttle's expiry.
    finished: VecDeque<(Instant, L3Key)>,
    jobs: Option<flume::Sender<Job>>,
    results: flume::Receiver<JobResult>,
    workers: Vec<std::thread::JoinHandle<()>>,
    stats: L3Stats,
    /// Tests only: told each time a batch get starts waiting for promotions.
    waiting: Option<flume::Sender<()>>,
    /// The envelope being read, kept between gets.
    read_buf: Vec<u8>,
}

/// Tests only: holds promotions in flight, and says when a get waits for them.
struct Gate {
    /// Each worker takes one token before each read.
    open: flume::Receiver<()>,
    /// A batch get sends one token when it starts waiting.
    waiting: flume::Sender<()>,
}

fn io(path: &Path, source: std::io::Error) -> L3Error {
    L3Error::Io {
        path: path.display().to_string(),
        source,
    }
}

impl LocalStore {
    /// Opens (or creates) a store; objects already in the directory are kept.
    pub fn open(cfg: LocalStoreConfig) -> Result<Self, L3Error> {
        Self::open_with_gate(cfg, None)
    }

    /// As `open`; with a gate, each worker waits for one token on it before each read
    /// (tests hold promotions in flight this way).
    fn open_with_gate(cfg: LocalStoreConfig, gate: Option<Gate>) -> Result<Self, L3Error> {
        let (open, waiting) = gate.map(|g| (g.open, g.waiting)).unzip();
        if cfg.prefetch_workers == 0 || cfg.prefetch_queue == 0 {
            return Err(L3Error::Config(
                "prefetch workers and queue must be positive".into(),
            ));
        }
        std::fs::create_dir_all(&cfg.dir).map_err(|e| io(&cfg.dir, e))?;
        let (job_tx, job_rx) = flume::bounded::<Job>(cfg.prefetch_queue);
        let (res_tx, res_rx) = flume::unbounded::<JobResult>();
        let workers = (0..cfg.prefetch_workers)
            .map(|_| {
                let (jobs, results, gate) = (job_rx.clone(), res_tx.clone(), open.clone());
                std::thread::spawn(move || {
                    for job in jobs.iter() {
                        if gate.as_ref().is_some_and(|g| g.recv().is_err()) {
                            return;
                        }
                        let payload = segments::read_at(&job.path, job.offset, job.size)
                            .and_then(|b| codec::decode(job.key.as_str(), &b));
                        if results.send((job.key, payload)).is_err() {
                            return;
                        }
                    }
                })
            })
            .collect();
        let (log, records) = Segments::open(&cfg.dir, cfg.segment_bytes)?;
        let mut store = Self {
            cfg,
            log,
            memory: HashMap::new(),
            memory_lru: BTreeMap::new(),
            memory_used: 0,
            disk: HashMap::new(),
            disk_lru: BTreeMap::new(),
            disk_used: 0,
            tick: 0,
            promotions: HashMap::new(),
            finished: VecDeque::new(),
            jobs: Some(job_tx),
            results: res_rx,
            workers,
            stats: L3Stats::default(),
            waiting,
            read_buf: Vec::new(),
        };
        store.replay(records);
        Ok(store)
    }

    /// Rebuilds the disk index from the log's records, oldest first in LRU order: a
    /// key's first object wins (objects are write-once), a tombstone removes it, a
    /// corrupt record is counted and skipped. Then the disk bound is enforced and
    /// segments without live objects are deleted.
    fn replay(&mut self, records: Vec<Record>) {
        for record in records {
            match record {
                Record::Object(key, len, extent) => {
                    let key = L3Key::from_stored(key);
                    if self.disk.contains_key(&key) {
                        continue;
                    }
                    self.tick += 1;
                    self.log.mark_live(&extent);
                    self.disk.insert(key.clone(), (len, self.tick, extent));
                    self.disk_lru.insert(self.tick, key);
                    self.disk_used += len;
                }
                Record::Corrupt => self.stats.corrupt_objects += 1,
                Record::Tombstone(key) => {
                    let key = L3Key::from_stored(key);
                    if let Some((len, at, extent)) = self.disk.remove(&key) {
                        self.disk_lru.remove(&at);
                        self.disk_used -= len;
                        self.log.unmark(&extent);
                    }
                }
            }
        }
        while self.disk_used > self.cfg.disk_bytes {
            let Some(old) = self.disk_lru.values().next().cloned() else {
                break;
            };
            self.drop_disk(&old);
        }
        self.log.drop_dead();
    }

    /// Applies finished promotions and sweeps expired throttle entries (never in-flight
    /// ones).
    fn drain(&mut self) {
        while let Ok(result) = self.results.try_recv() {
            self.finish_promotion(result);
        }
        // Done entries expire in the order they finished: only the expired ones are
        // visited (a sweep of every entry read the clock once per entry, every call).
        let now = Instant::now();
        while let Some((at, _)) = self.finished.front()
            && now.duration_since(*at) >= self.cfg.prefetch_ttl
        {
            let Some((at, key)) = self.finished.pop_front() else {
                break;
            };
            // Only if it was not promoted again (or removed) since.
            if matches!(self.promotions.get(&key), Some(Promotion::Done(t)) if *t == at) {
                self.promotions.remove(&key);
            }
        }
    }

    fn finish_promotion(&mut self, (key, payload): JobResult) {
        match payload {
            Some(payload) if self.disk.contains_key(&key) => {
                self.insert_memory(key.clone(), payload);
                let now = Instant::now();
                self.promotions.insert(key.clone(), Promotion::Done(now));
                self.finished.push_back((now, key));
            }
            _ => {
                // Failed (absent, corrupt, or removed meanwhile): clear the entry so a
                // later hint can try again.
                self.stats.promotions_failed += 1;
                self.promotions.remove(&key);
            }
        }
    }

    fn insert_memory(&mut self, key: L3Key, payload: Vec<u8>) {
        let len = payload.len() as u64;
        if len > self.cfg.memory_bytes || self.memory.contains_key(&key) {
            return;
        }
        while self.memory_used + len > self.cfg.memory_bytes {
            let Some((_, old)) = self.memory_lru.pop_first() else {
                break;
            };
            if let Some((bytes, _)) = self.memory.remove(&old) {
                self.memory_used -= bytes.len() as u64;
            }
        }
        self.tick += 1;
        self.memory_lru.insert(self.tick, key.clone());
        self.memory.insert(key, (payload, self.tick));
        self.memory_used += len;
    }

    fn touch_memory(&mut self, key: &L3Key) {
        self.tick += 1;
        if let Some((_, at)) = self.memory.get_mut(key) {
            self.memory_lru.remove(at);
            *at = self.tick;
            self.memory_lru.insert(self.tick, key.clone());
        }
    }

    fn drop_disk(&mut self, key: &L3Key) {
        if let Some((len, at, extent)) = self.disk.remove(key) {
            self.disk_lru.remove(&at);
            self.disk_used -= len;
            self.log.forget(&extent);
        }
    }

    fn drop_object(&mut self, key: &L3Key) {
        if let Some((bytes, at)) = self.memory.remove(key) {
            self.memory_lru.remove(&at);
            self.memory_used -= bytes.len() as u64;
        }
        self.drop_disk(key);
    }

    /// Appends the objects `batch` names (indices into `keys`) in one write and indexes
    /// them; if the write fails, none of them is stored.
    fn commit(
        &mut self,
        keys: &[L3Key],
        buffers: &[&[u8]],
        batch: &[usize],
        out: &mut [PutOutcome],
    ) {
        let objects: Vec<(&str, &[u8])> = batch
            .iter()
            .map(|&i| (keys[i].as_str(), buffers[i]))
            .collect();
        let Ok(extents) = self.log.append_objects(&objects) else {
            return;
        };
        for (&i, extent) in batch.iter().zip(extents) {
            let (key, payload) = (&keys[i], buffers[i]);
            let len = payload.len() as u64;
            self.tick += 1;
            self.disk.insert(key.clone(), (len, self.tick, extent));
            self.disk_lru.insert(self.tick, key.clone());
            self.disk_used += len;
            out[i] = PutOutcome::Stored;
        }
    }

    /// When dead records outgrow the live ones, copies the oldest segment's live
    /// objects forward (one write, their LRU order kept) and deletes it.
    fn compact(&mut self) {
        while let Some(n) = self.log.compaction_candidate(self.cfg.disk_bytes) {
            let mut live: Vec<(u64, L3Key, Extent)> = self
                .disk
                .iter()
                .filter(|(_, (_, _, e))| e.segment == n)
                .map(|(k, (_, tick, e))| (*tick, k.clone(), *e))
                .collect();
            live.sort_by_key(|(tick, _, _)| *tick);
            let mut keep = Vec::with_capacity(live.len());
            let mut envelopes = Vec::with_capacity(live.len());
            for (_, key, extent) in &live {
                match self.log.read(extent) {
                    Some(envelope) => {
                        keep.push(key.clone());
                        envelopes.push(envelope);
                    }
                    None => self.stats.corrupt_objects += 1,
                }
            }
            let bodies: Vec<(&str, Vec<u8>)> =
                keep.iter().map(|k| k.as_str()).zip(envelopes).collect();
            let Ok(extents) = self.log.append(&bodies) else {
                return;
            };
            for (key, extent) in keep.iter().zip(extents) {
                if let Some(entry) = self.disk.get_mut(key) {
                    entry.2 = extent;
                }
            }
            for (_, key, _) in &live {
                if !keep.contains(key) {
                    self.drop_disk(key);
                }
            }
            self.log.drop_segment(n);
        }
    }

    /// Reads and verifies an object from disk.
    /// Reads a disk object's payload into `out` (exactly its length); a corrupt object
    /// is dropped. `out` is untouched unless it returns `true`.
    fn read_disk_into(&mut self, key: &L3Key, out: &mut [u8]) -> bool {
        let Some(&(len, _, extent)) = self.disk.get(key) else {
            return false;
        };
        if len != out.len() as u64 {
            return false;
        }
        let mut envelope = std::mem::take(&mut self.read_buf);
        let read = self.log.read_into(&extent, &mut envelope)
            && codec::decode_into(key.as_str(), &envelope, out);
        self.read_buf = envelope;
        if !read {
            self.stats.corrupt_objects += 1;
            self.drop_object(key);
        }
        read
    }
}

impl L3Backend for LocalStore {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            prefetch_on_exist: true,
        }
    }

    fn exists(&mut self, keys: &[L3Key], prefetch_to_memory: bool) -> Result<usize, L3Error> {
        self.drain();
        let hits = keys
            .iter()
            .take_while(|k| self.memory.contains_key(*k) || self.disk.contains_key(*k))
            .count();
        if prefetch_to_memory {
            for key in &keys[..hits] {
                if self.memory.contains_key(key) {
                    continue;
                }
                if self.promotions.contains_key(key) {
                    self.stats.hints_deduplicated += 1;
                    continue;
                }
                let Some((path, offset, size)) = self
                    .disk
                    .get(key)
                    .and_then(|(_, _, extent)| self.log.locate(extent))
                else {
                    continue;
                };
                let job = Job {
                    key: key.clone(),
                    path,
                    offset,
                    size,
                };
                // A full queue drops the hint; registration happens only once queued, so
                // a dropped hint leaves no entry behind to block later ones.
                if self
                    .jobs
                    .as_ref()
                    .is_some_and(|tx| tx.try_send(job).is_ok())
                {
                    self.promotions.insert(key.clone(), Promotion::InFlight);
                    self.stats.promotions_started += 1;
                }
            }
        }
        Ok(hits)
    }

    fn get(&mut self, keys: &[L3Key], buffers: &mut [&mut [u8]]) -> Result<Vec<bool>, L3Error> {
        check_batch(keys.len(), buffers.len())?;
        self.drain();
        // One deadline for the whole batch: wait on the result channel while any key
        // of the batch is still being promoted.
        let in_flight = |s: &Self| {
            keys.iter()
                .any(|k| matches!(s.promotions.get(k), Some(Promotion::InFlight)))
        };
        if in_flight(self) {
            self.stats.get_waits += 1;
            if let Some(waiting) = &self.waiting {
                let _ = waiting.send(());
            }
            let deadline = Instant::now() + self.cfg.get_deadline;
            while in_flight(self) {
                match self.results.recv_deadline(deadline) {
                    Ok(result) => self.finish_promotion(result),
                    Err(_) => break,
                }
            }
        }
        let mut out = Vec::with_capacity(keys.len());
        for (key, buffer) in keys.iter().zip(buffers.iter_mut()) {
            // A memory hit is copied straight into the buffer; anything else is read from
            // disk, also when its promotion missed the deadline (the wait only saves a
            // disk read, it never turns a stored object into a miss).
            let hit = match self.memory.get(key) {
                Some((bytes, _)) if bytes.len() == buffer.len() => {
                    buffer.copy_from_slice(bytes);
                    self.touch_memory(key);
                    true
                }
                Some(_) => false,
                None => self.read_disk_into(key, buffer),
            };
            if hit {
                self.stats.get_hits += 1;
            } else {
                self.stats.get_misses += 1;
            }
            out.push(hit);
        }
        Ok(out)
    }

    fn put(&mut self, keys: &[L3Key], buffers: &[&[u8]]) -> Result<Vec<PutOutcome>, L3Error> {
        check_batch(keys.len(), buffers.len())?;
        self.drain();
        let mut out = vec![PutOutcome::Failed; keys.len()];
        // The batch's new objects go to the log together, in one write; only when the
        // disk cannot hold the next one beside them are they written first, so that
        // they can be evicted like any stored object.
        let mut batch: Vec<usize> = Vec::new();
        let mut seen = HashSet::with_capacity(keys.len());
        let mut pending = 0u64;
        for (i, (key, payload)) in keys.iter().zip(buffers).enumerate() {
            let duplicate = !seen.insert(key);
            if duplicate || self.disk.contains_key(key) || self.memory.contains_key(key) {
                out[i] = PutOutcome::AlreadyPresent;
                continue;
            }
            let len = payload.len() as u64;
            if len > self.cfg.disk_bytes {
                continue;
            }
            if self.disk_used + pending + len > self.cfg.disk_bytes && !batch.is_empty() {
                self.commit(keys, buffers, &std::mem::take(&mut batch), &mut out);
                pending = 0;
            }
            while self.disk_used + pending + len > self.cfg.disk_bytes {
                let Some(old) = self.disk_lru.values().next().cloned() else {
                    break;
                };
                self.drop_object(&old);
            }
            pending += len;
            batch.push(i);
        }
        self.commit(keys, buffers, &batch, &mut out);
        self.compact();
        Ok(out)
    }

    fn remove(&mut self, keys: &[L3Key]) -> Result<usize, L3Error> {
        self.drain();
        let mut removed = 0;
        let mut gone = Vec::new();
        for key in keys {
            if self.disk.contains_key(key) {
                gone.push(key.as_str());
            }
            if self.disk.contains_key(key) || self.memory.contains_key(key) {
                removed += 1;
            }
            self.drop_object(key);
            self.promotions.remove(key);
        }
        // Tombstones keep them removed across a restart.
        self.log.tombstones(&gone)?;
        Ok(removed)
    }

    fn stats(&self) -> L3Stats {
        L3Stats {
            memory_objects: self.memory.len() as u64,
            memory_bytes: self.memory_used,
            disk_objects: self.disk.len() as u64,
            disk_bytes: self.disk_used,
            ..self.stats
        }
    }
}

impl Drop for LocalStore {
    fn drop(&mut self) {
        // Closing the job channel ends the workers once they finish their current read.
        self.jobs = None;
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

#[cfg(test)]
mod tests;
