//! `L3Core`: the L3 store actor's functional core.
//!
//! It owns the backend and the key namespace and reaches the host arena, which it
//! shares with the device actor. Three calls, each one batch:
//!
//! * [`L3Core::answer`] at submit: how many of each prompt's pages, from the first, the
//!   store holds (the scheduler's `storage_hit_pages`); the scheduler does not wait for
//!   it. Keys are derived here from the
//!   tokens, 128 pages at a time, and the query stops at the first chunk that misses.
//! * [`L3Core::transfer`] each step: a plan's prefetches (gets straight into the host
//!   pages the scheduler allocated) and backups (puts straight from the pinned host
//!   pages), answered with `PrefetchDone` / `BackupDone` events.
//! * [`L3Core::stats`].
//!
//! Every failure is a miss: a backend error, a page the arena refuses, an object lost
//! between the lookup and the get, or a corrupt one. A prefetch reports only its leading
//! pages that arrived whole and verified, so the scheduler never inserts KV it did not get.
//! A backup is all or nothing: one that fails removes the objects it did store, so a
//! `BackupDone { success: false }` leaves nothing of itself to be served later.

use std::sync::Arc;

use kvtier_host::HostArena;
use kvtier_types::hash::PageHash;
use kvtier_types::{BackupOp, EngineEvent, LookupAsk, PrefetchOp, RequestSpec, StateObject, Token};

use crate::backend::{L3Backend, L3Stats, PutOutcome};
use crate::{L3Error, L3Key, Namespace};

/// Pages per existence query: a lookup stops at the first chunk that is not all hits,
/// so a long prompt that misses early costs one small query (and, on Mooncake, leases
/// no objects it will not read).
pub const LOOKUP_CHUNK: usize = 128;

/// Fault injection at the L3 actor, for tests of the failure paths. The hooks act on the
/// real backend (they may remove objects from it) or fail the call outright.
pub trait L3Faults: Send + std::fmt::Debug {
    /// Before a prefetch's get of `keys`. `Err` fails the whole get.
    fn before_get(&mut self, _keys: &[L3Key], _backend: &mut dyn L3Backend) -> Result<(), L3Error> {
        Ok(())
    }

    /// Before a lookup's existence query. `Err` fails the query (no hits).
    fn before_exists(&mut self, _keys: &[L3Key]) -> Result<(), L3Error> {
        Ok(())
    }

    /// Before a backup's put of `keys`: how many of them, from the first, the store
    /// takes before it fails (all of them by default; fewer models a store that runs out
    /// of room or connection mid-batch). `Err` fails the put outright.
    fn before_put(&mut self, keys: &[L3Key]) -> Result<usize, L3Error> {
        Ok(keys.len())
    }
}

/// No faults.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoL3Faults;

impl L3Faults for NoL3Faults {}

/// Counters of the L3 actor (the backend's own counters inside).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct L3TierStats {
    /// Prompts looked up at submit.
    pub lookups: u64,
    /// Pages found by lookups (consecutive from each prompt's first page).
    pub lookup_hit_pages: u64,
    /// Existence queries that failed (counted as no hits).
    pub lookup_errors: u64,
    /// Prefetch ops executed.
    pub prefetch_ops: u64,
    /// Pages they asked for.
    pub prefetch_pages: u64,
    /// Pages that arrived whole (the leading ones reported as completed).
    pub prefetched_pages: u64,
    /// Bytes of those pages.
    pub prefetched_bytes: u64,
    /// Prefetch ops that failed outright (backend error, arena refusal, bad op).
    pub failed_prefetches: u64,
    /// Backup ops executed.
    pub backup_ops: u64,
    /// Pages stored by backups.
    pub backed_up_pages: u64,
    /// Bytes of those pages.
    pub backed_up_bytes: u64,
    /// Pages a backup found already stored (objects are write-once).
    pub already_present_pages: u64,
    /// Recurrent states stored by backups (hybrid models).
    pub backed_up_states: u64,
    /// Recurrent states prefetched with their pages (hybrid models).
    pub prefetched_states: u64,
    /// Hybrid prefetches whose last state did not come back, served up to an earlier
    /// state instead.
    pub shorter_state_prefetches: u64,
    /// Backup ops with a page not stored (none of their objects is kept).
    pub failed_backups: u64,
    /// Objects of failed backups the store would not take back (its removal failed
    /// too). Their bytes are right; only the all-or-nothing promise is broken.
    pub unremoved_objects: u64,
    /// Wall-clock duration of each lookup message (every prompt of it).
    pub lookup_duration: kvtier_types::WallClock<kvtier_types::Histogram>,
    /// Wall-clock duration of each transfer message (a plan's prefetches and backups).
    pub transfer_duration: kvtier_types::WallClock<kvtier_types::Histogram>,
    /// The backend's counters.
    pub backend: L3Stats,
}

/// The L3 store actor's core.
pub struct L3Core {
    // Declared before `arena`: a backend with the arena registered goes first.
    backend: Box<dyn L3Backend>,
    arena: Arc<HostArena>,
    /// Hybrid models: the host state arena (slot `s` is its page `s + 1`).
    states: Option<Arc<HostArena>>,
    namespace: Namespace,
    page_size: usize,
    faults: Box<dyn L3Faults>,
    stats: L3TierStats,
}

impl std::fmt::Debug for L3Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("L3Core")
            .field("namespace", &self.namespace)
            .field("page_size", &self.page_size)
            .field("arena", &self.arena)
            .field("stats", &self.stats)
            .finish()
    }
}

impl L3Core {
    /// Counts a lookup message's duration.
    pub(crate) fn observe_lookup(&mut self, took: std::time::Duration) {
        self.stats.lookup_duration.observe(took);
    }

    /// Counts a transfer message's duration.
    pub(crate) fn observe_transfer(&mut self, took: std::time::Duration) {
        self.stats.transfer_duration.observe(took);
    }

    /// A core over `backend`, naming objects in `namespace`, moving whole host pages of
    /// `arena` (one object per page, all layers), for pages of `page_size` tokens.
    pub fn new(
        backend: Box<dyn L3Backend>,
        namespace: Namespace,
        page_size: u32,
        arena: Arc<HostArena>,
    ) -> Result<Self, L3Error> {
        if page_size == 0 {
            return Err(L3Error::Config("page size must be positive".into()));
        }
        Ok(Self {
            backend,
            arena,
            states: None,
            namespace,
            page_size: page_size as usize,
            faults: Box::new(NoL3Faults),
            stats: L3TierStats::default(),
        })
    }

    /// A hybrid model: recurrent states move between the store and this host state
    /// arena (one object per state), and a prompt is found in the store only as deep as
    /// a stored state.
    pub fn with_states(mut self, arena: Arc<HostArena>) -> Self {
        self.states = Some(arena);
        self
    }

    /// The host state arena, for a hybrid model.
    pub fn state_arena(&self) -> Option<&Arc<HostArena>> {
        self.states.as_ref()
    }

    /// Injects faults.
    pub fn with_faults(mut self, faults: Box<dyn L3Faults>) -> Self {
        self.faults = faults;
        self
    }

    /// Tokens per page.
    pub fn page_size(&self) -> u32 {
        self.page_size as u32
    }

    /// The host arena it moves pages of.
    pub fn arena(&self) -> &Arc<HostArena> {
        &self.arena
    }

    /// The backend (tests reach the store through it).
    pub fn backend_mut(&mut self) -> &mut dyn L3Backend {
        self.backend.as_mut()
    }

    /// Sets each spec's `storage_hit_pages`: the consecutive pages, from the first, of its
    /// full pages before the last token that the store holds. Prompts with no more than
    /// `threshold` such pages could never be prefetched and are not looked up.
    pub fn lookup(&mut self, specs: &mut [RequestSpec], threshold: u32) {
        for spec in specs {
            spec.storage_hit_pages = 0;
            if kvtier_types::lookup_pages(spec.tokens.len(), self.page_size as u32)
                > threshold as usize
            {
                spec.storage_hit_pages = self.hit_pages(&spec.tokens);
            }
        }
    }

    /// Answers a scheduler's lookup: each prompt's hit pages, in order.
    pub fn answer(&mut self, ask: &LookupAsk) -> Vec<u32> {
        ask.prompts.iter().map(|p| self.hit_pages(p)).collect()
    }

    /// The consecutive pages, from the first, of the prompt's full pages before its last
    /// token that the store holds.
    fn hit_pages(&mut self, tokens: &[Token]) -> u32 {
        let hint = self.backend.capabilities().prefetch_on_exist;
        let full = kvtier_types::lookup_pages(tokens.len(), self.page_size as u32);
        self.stats.lookups += 1;
        let mut prior: Option<PageHash> = None;
        let mut hits = 0usize;
        // Hybrid models: the hit pages' hashes, to look for their states.
        let mut hit_hashes = Vec::new();
        for chunk in tokens[..full * self.page_size].chunks(LOOKUP_CHUNK * self.page_size) {
            let hashes =
                kvtier_types::hash::rolling_page_hashes(prior.as_ref(), chunk, self.page_size);
            prior = hashes.last().copied();
            let keys = self.namespace.keys(&hashes);
            let found = self
                .faults
                .before_exists(&keys)
                .and_then(|()| self.backend.exists(&keys, hint));
            match found {
                Ok(n) => {
                    hits += n.min(keys.len());
                    if self.states.is_some() {
                        hit_hashes.extend_from_slice(&hashes[..n.min(keys.len())]);
                    }
                    if n < keys.len() {
                        break;
                    }
                }
                Err(_) => {
                    self.stats.lookup_errors += 1;
                    break;
                }
            }
        }
        if self.states.is_some() && hits > 0 {
            hits = self.deepest_state(&hit_hashes);
        }
        self.stats.lookup_hit_pages += hits as u64;
        hits as u32
    }

    /// Hybrid models: the deepest page count, at most that of `hashes` (the rolling hashes
    /// of a prompt's first pages), after which the store holds a recurrent state (0:
    /// none), looking back at most [`LOOKUP_CHUNK`] pages from the end.
    fn deepest_state(&mut self, hashes: &[PageHash]) -> usize {
        for pages in (1..=hashes.len()).rev().take(LOOKUP_CHUNK) {
            let key = self.namespace.state_key(&hashes[pages - 1]);
            let keys = std::slice::from_ref(&key);
            let found = self
                .faults
                .before_exists(keys)
                .and_then(|()| self.backend.exists(keys, false));
            match found {
                Ok(1) => return pages,
                Ok(_) => {}
                Err(_) => {
                    self.stats.lookup_errors += 1;
                    return 0;
                }
            }
        }
        0
    }

    /// Runs a plan's prefetches and backups; returns one `PrefetchDone` per prefetch and
    /// one `BackupDone` per backup, in that order.
    pub fn transfer(
        &mut self,
        prefetches: &[PrefetchOp],
        backups: &[BackupOp],
    ) -> Vec<EngineEvent> {
        let mut events = Vec::with_capacity(prefetches.len() + backups.len());
        for op in prefetches {
            let completed = self.prefetch(op);
            events.push(EngineEvent::PrefetchDone {
                op_id: op.op_id,
                request_id: op.request_id.clone(),
                success: completed.is_some(),
                completed_pages: completed.unwrap_or(0),
            });
        }
        for op in backups {
            events.push(EngineEvent::BackupDone {
                op_id: op.op_id,
                success: self.backup(op),
            });
        }
        events
    }

    /// Gets the op's objects into its host pages; the leading pages that arrived whole,
    /// or `None` when the fetch failed outright.
    fn prefetch(&mut self, op: &PrefetchOp) -> Option<u32> {
        self.stats.prefetch_ops += 1;
        self.stats.prefetch_pages += op.dst_pages.len() as u64;
        let got = (|| {
            if op.dst_pages.len() != op.page_hashes.len() {
                return Err(L3Error::BatchMismatch {
                    keys: op.page_hashes.len(),
                    buffers: op.dst_pages.len(),
                });
            }
            let mut keys = self.namespace.keys(&op.page_hashes);
            let mut pages = self.arena.write(&op.dst_pages).map_err(arena_refused)?;
            let mut buffers = pages.slices_mut();
            // A hybrid prefix's state comes in the same batch, last.
            let mut state = match (&op.state, &self.states) {
                (Some(s), Some(arena)) => {
                    keys.push(self.namespace.state_key(&s.page_hash));
                    Some(arena.write(&[s.slot + 1]).map_err(arena_refused)?)
                }
                (Some(_), None) => return Err(L3Error::Config("no host state arena".into())),
                (None, _) => None,
            };
            if let Some(state) = &mut state {
                buffers.extend(state.slices_mut());
            }
            self.faults.before_get(&keys, self.backend.as_mut())?;
            let hits = self.backend.get(&keys, &mut buffers)?;
            let leading = hits
                .iter()
                .take(op.page_hashes.len())
                .take_while(|&&hit| hit);
            Ok((leading.count(), hits.last() == Some(&true)))
        })();
        // A hybrid prefix needs the state after its last page.
        let got = match (got, &op.state) {
            (Ok((leading, state_arrived)), Some(wanted))
                if leading < op.page_hashes.len() || !state_arrived =>
            {
                Ok(self.earlier_state(wanted, &op.page_hashes[..leading]))
            }
            (got, _) => got.map(|(leading, _)| leading),
        };
        match got {
            Ok(completed) => {
                let completed = completed as u64;
                if op.state.is_some() && completed > 0 {
                    self.stats.prefetched_states += 1;
                }
                self.stats.prefetched_pages += completed;
                self.stats.prefetched_bytes += completed * self.arena.page_bytes() as u64;
                Some(completed as u32)
            }
            Err(_) => {
                self.stats.failed_prefetches += 1;
                None
            }
        }
    }

    /// A hybrid prefetch came back without the state after its last page (lost or
    /// corrupt), or without some of its pages: falls back to the deepest state after one
    /// of the leading pages that did arrive (`arrived`), read into the op's state slot.
    /// The pages that arrived beyond that state are of no use. Returns how many pages the
    /// state follows (0: none came back, a miss).
    fn earlier_state(&mut self, wanted: &StateObject, arrived: &[PageHash]) -> usize {
        let Some(arena) = self.states.clone() else {
            return 0;
        };
        for depth in (1..=arrived.len()).rev().take(LOOKUP_CHUNK) {
            let page = &arrived[depth - 1];
            if *page == wanted.page_hash {
                continue; // the state that just failed
            }
            let key = self.namespace.state_key(page);
            let Ok(mut slot) = arena.write(&[wanted.slot + 1]) else {
                return 0;
            };
            let got = self
                .backend
                .get(std::slice::from_ref(&key), &mut slot.slices_mut());
            if matches!(got.as_deref(), Ok([true])) {
                self.stats.shorter_state_prefetches += 1;
                return depth;
            }
        }
        0
    }

    /// Puts the op's pinned host pages; whether every page is stored.
    fn backup(&mut self, op: &BackupOp) -> bool {
        self.stats.backup_ops += 1;
        let put = (|| {
            if op.src_pages.len() != op.page_hashes.len() {
                return Err(L3Error::BatchMismatch {
                    keys: op.page_hashes.len(),
                    buffers: op.src_pages.len(),
                });
            }
            let mut keys = self.namespace.keys(&op.page_hashes);
            let pages = self.arena.read(&op.src_pages).map_err(arena_refused)?;
            let mut buffers = pages.slices();
            // A hybrid prefix's states go with its pages, all or nothing.
            let states = if op.states.is_empty() {
                None
            } else {
                let arena = self.states.as_ref();
                let arena = arena.ok_or_else(|| L3Error::Config("no host state arena".into()))?;
                let slots: Vec<u32> = op.states.iter().map(|s| s.slot + 1).collect();
                Some(arena.read(&slots).map_err(arena_refused)?)
            };
            if let Some(states) = &states {
                keys.extend(
                    op.states
                        .iter()
                        .map(|s| self.namespace.state_key(&s.page_hash)),
                );
                buffers.extend(states.slices());
            }
            let taken = self.faults.before_put(&keys)?.min(keys.len());
            let mut outcomes = self.backend.put(&keys[..taken], &buffers[..taken])?;
            outcomes.resize(keys.len(), PutOutcome::Failed);
            Ok((keys, outcomes))
        })();
        let page_bytes = self.arena.page_bytes() as u64;
        match put {
            Ok((_, outcomes)) if !outcomes.contains(&PutOutcome::Failed) => {
                let pages = op.src_pages.len();
                self.stats.backed_up_states += outcomes[pages..]
                    .iter()
                    .filter(|&&o| o == PutOutcome::Stored)
                    .count() as u64;
                for outcome in outcomes.into_iter().take(pages) {
                    if outcome == PutOutcome::Stored {
                        self.stats.backed_up_pages += 1;
                        self.stats.backed_up_bytes += page_bytes;
                    } else {
                        self.stats.already_present_pages += 1;
                    }
                }
                true
            }
            Ok((keys, outcomes)) => {
                // All or nothing: take back what this backup stored (objects that were
                // already present belong to earlier backups and stay).
                let stored: Vec<L3Key> = keys
                    .into_iter()
                    .zip(outcomes)
                    .filter(|(_, outcome)| *outcome == PutOutcome::Stored)
                    .map(|(key, _)| key)
                    .collect();
                if !stored.is_empty() && self.backend.remove(&stored).is_err() {
                    self.stats.unremoved_objects += stored.len() as u64;
                }
                self.stats.failed_backups += 1;
                false
            }
            Err(_) => {
                self.stats.failed_backups += 1;
                false
            }
        }
    }

    /// Counters, the backend's included.
    pub fn stats(&self) -> L3TierStats {
        L3TierStats {
            backend: self.backend.stats(),
            ..self.stats
        }
    }
}

fn arena_refused(e: kvtier_host::HostError) -> L3Error {
    L3Error::Io {
        path: "host arena".into(),
        source: std::io::Error::other(e.to_string()),
    }
}
