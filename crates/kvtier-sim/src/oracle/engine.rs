//! The oracle engine itself: the tracks of the requests it knows, where each page's
//! bytes came from, and the forward that writes and checks them.

use std::any::Any;
use std::collections::BTreeMap;

use kvtier_device::{
    DeviceCore, DeviceError, DeviceView, KvArenas, KvGeometry, ModelRunner, NewRequest,
    StateGeometry,
};
use kvtier_types::{
    EngineEvent, ExecutionPlan, PageId, RequestId, RowKind, Tier, Token, TransferKind,
    TransferPair, engine_rule,
};

use super::*;
use crate::groups::{GroupMemory, RowGroups};
use crate::tokens::splitmix64;

/// Where a device page's bytes came from, as the engine saw them move.
#[derive(Debug, Clone)]
enum DeviceSource {
    Fresh,
    Computed(RequestId),
    LoadedBack { host_page: PageId, from: HostSource },
}

/// Where a host page's bytes came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HostSource {
    Unwritten,
    WrittenBack,
    Prefetched,
}

impl DeviceSource {
    /// The provenance a row of `reader` reports.
    fn seen_by(&self, reader: &RequestId) -> Provenance {
        match self {
            DeviceSource::Fresh => Provenance::Fresh,
            DeviceSource::Computed(by) if by == reader => Provenance::Computed,
            DeviceSource::Computed(by) => Provenance::PublishedBy(by.clone()),
            DeviceSource::LoadedBack {
                host_page,
                from: HostSource::Prefetched,
            } => Provenance::Prefetched {
                host_page: *host_page,
            },
            DeviceSource::LoadedBack { host_page, .. } => Provenance::LoadedBack {
                host_page: *host_page,
            },
        }
    }
}

#[derive(Debug)]
struct Track {
    tokens: Vec<Token>,
    /// Rolling hash of `tokens[..=i]` for every position.
    prefix: Vec<u64>,
    /// Mixed into the next-token function so samples of one prompt differ.
    salt: u64,
    max_new: usize,
    generated: usize,
    /// No prefill row seen yet (the next one is the first chunk).
    first_chunk_pending: bool,
}

impl Track {
    fn push(&mut self, token: Token) {
        let prev = self.prefix.last().copied().unwrap_or(0x6b76_7469_6572);
        let i = self.prefix.len() as u64;
        self.prefix
            .push(splitmix64(prev ^ (token as u32 as u64) ^ (i << 32)));
        self.tokens.push(token);
    }
}

/// The oracle engine.
#[derive(Debug)]
pub struct OracleEngine {
    geometry: KvGeometry,
    verify: Verify,
    /// Per device page.
    device_sources: Vec<DeviceSource>,
    /// Per host page (grown on demand: the engine learns the pool from the copies).
    host_sources: Vec<HostSource>,
    /// Looked up by id only, never iterated: its order cannot reach an answer.
    tracks: std::collections::HashMap<RequestId, Track>,
    /// Integrity errors found so far.
    pub errors: Vec<IntegrityError>,
    /// Tokens generated per finished request.
    pub outputs: BTreeMap<RequestId, Vec<Token>>,
    /// Steps run.
    steps: u64,
    /// Full pages ever computed, by the prefix hash of their last token → the step.
    computed_pages: std::collections::HashMap<u64, u64>,
    /// Σ over first prefill chunks of the full prompt pages some request had computed
    /// in an earlier step: the best any prefix cache could have reused.
    pub ideal_hit_pages: u64,
    /// Device pages of this step's failed load-backs: rows reading them are skipped.
    void_pages: std::collections::BTreeSet<PageId>,
    /// Device state slots of this step's failed load-backs: rows copying them are
    /// skipped.
    void_states: std::collections::BTreeSet<u32>,
    /// Rows skipped because they read a failed load-back.
    pub void_rows: u64,
    /// A hybrid model's recurrent state, if the model has one.
    states: Option<StateModel>,
    /// A paged model's group entries, if the model has groups.
    groups: Option<GroupMemory>,
}

/// The recurrent state of a hybrid model.
#[derive(Debug, Clone, Copy)]
struct StateModel {
    geometry: StateGeometry,
    /// The checkpoint rule's chunk (`MambaSettings::chunk`).
    chunk: u32,
    /// Device and host state slots.
    device_slots: u32,
    host_slots: u32,
}

/// Word `w` of layer `layer` of the state after the prefix of length `len` whose
/// rolling hash is `h` (word 0 holds `len`, so a stale state says which it is).
fn state_word(len: u32, h: u64, layer: u32, w: usize) -> u64 {
    if w == 0 {
        return u64::from(len);
    }
    splitmix64(h ^ 0x5354_4154_4500_0000 ^ (u64::from(layer) << 40) ^ w as u64)
}

/// Bytes of one token in one (layer, plane): one slot.
fn slot_bytes(g: &KvGeometry) -> usize {
    (g.item_bytes() / u64::from(g.page_size)) as usize
}

/// The KV word `w` of a slot whose prefix hash is `h`.
fn kv_word(h: u64, layer: u32, plane: u32, w: usize) -> u64 {
    splitmix64(h ^ (u64::from(layer) << 40) ^ (u64::from(plane) << 36) ^ w as u64)
}

impl OracleEngine {
    /// An engine for a device pool of `device_pages` (page 0 included). Slots must be
    /// whole 8-byte words.
    pub fn new(
        geometry: KvGeometry,
        device_pages: u32,
        verify: Verify,
    ) -> Result<Self, DeviceError> {
        if !slot_bytes(&geometry).is_multiple_of(8) || slot_bytes(&geometry) == 0 {
            return Err(DeviceError::InvalidGeometry(
                "the oracle engine needs token slots of whole 8-byte words".into(),
            ));
        }
        Ok(Self {
            geometry,
            verify,
            device_sources: vec![DeviceSource::Fresh; device_pages as usize],
            host_sources: Vec::new(),
            tracks: std::collections::HashMap::new(),
            errors: Vec::new(),
            outputs: BTreeMap::new(),
            steps: 0,
            computed_pages: std::collections::HashMap::new(),
            ideal_hit_pages: 0,
            void_pages: std::collections::BTreeSet::new(),
            void_states: std::collections::BTreeSet::new(),
            void_rows: 0,
            states: None,
            groups: None,
        })
    }

    /// A hybrid model: each request also carries a recurrent state of `geometry`
    /// (layers of whole 8-byte words), checkpointed by the rule with `chunk`, in pools
    /// of `device_slots` and `host_slots`.
    pub fn with_states(
        mut self,
        geometry: StateGeometry,
        chunk: u32,
        device_slots: u32,
        host_slots: u32,
    ) -> Result<Self, DeviceError> {
        if geometry.bytes_per_layer == 0 || !geometry.bytes_per_layer.is_multiple_of(8) {
            return Err(DeviceError::InvalidGeometry(
                "the oracle engine needs state layers of whole 8-byte words".into(),
            ));
        }
        self.states = Some(StateModel {
            geometry,
            chunk,
            device_slots,
            host_slots,
        });
        Ok(self)
    }

    /// A paged model: rows also read and write the entries of `groups` through their
    /// group tables (see [`crate::groups`]).
    pub fn with_groups(mut self, groups: Vec<kvtier_types::GroupSpec>) -> Self {
        self.groups = Some(GroupMemory::new(groups));
        self
    }

    /// The oracle engine a device runs its rows through, if that is its runner.
    pub fn of(device: &DeviceCore) -> Option<&OracleEngine> {
        device
            .runner()
            .and_then(|runner| runner.as_any().downcast_ref::<OracleEngine>())
    }

    /// A device core over fresh arenas for pools of `device_pages` and `host_pages`
    /// (page 0 included), with this engine as its model runner.
    pub fn into_device(self, host_pages: u32) -> Result<DeviceCore, DeviceError> {
        let device_pages = self.device_sources.len() as u32;
        let mut arenas = KvArenas::new(self.geometry, device_pages, host_pages.max(2), 2)?;
        if let Some(m) = self.states {
            arenas = arenas.with_states(m.geometry, m.device_slots, m.host_slots.max(1))?;
        }
        Ok(DeviceCore::new(arenas).with_runner(Box::new(self)))
    }

    /// Registers a submitted request: its prompt and how many tokens it generates.
    pub fn register(&mut self, id: RequestId, prompt: &[Token], max_new: usize) {
        let mut track = Track {
            tokens: Vec::with_capacity(prompt.len() + max_new),
            prefix: Vec::with_capacity(prompt.len() + max_new),
            salt: splitmix64(
                id.as_str()
                    .bytes()
                    .fold(0u64, |h, b| h.rotate_left(8) ^ u64::from(b)),
            ),
            max_new,
            generated: 0,
            first_chunk_pending: true,
        };
        for &t in prompt {
            track.push(t);
        }
        self.tracks.insert(id, track);
    }

    /// Forgets a request the scheduler aborted.
    pub fn forget(&mut self, id: &RequestId) {
        self.tracks.remove(id);
    }

    /// One row over its page table and its group tables.
    fn forward_row(
        &mut self,
        view: &mut DeviceView<'_>,
        states: Option<&mut DeviceView<'_>>,
        row: &kvtier_types::ForwardRow,
        (table, group_tables): (&[PageId], &[kvtier_types::GroupTable]),
        mut track: Track,
        events: &mut Vec<EngineEvent>,
    ) -> Result<Track, DeviceError> {
        // The positions this row computes; it reads every position before their end.
        let compute = match row.kind {
            RowKind::Prefill => {
                let begin = row.extend_prefix_len;
                begin..begin + row.input_length
            }
            RowKind::Decode | RowKind::Recovery => {
                let last = track.tokens.len() as u32 - 1;
                last..last + 1
            }
        };
        let ps = self.geometry.page_size;
        if row.kind == RowKind::Prefill && track.first_chunk_pending {
            track.first_chunk_pending = false;
            let full = (row.prefill_length.saturating_sub(1) / ps) as usize;
            let step = self.steps;
            self.ideal_hit_pages += (0..full)
                .take_while(|k| {
                    let h = track.prefix[(k + 1) * ps as usize - 1];
                    self.computed_pages.get(&h).is_some_and(|&at| at < step)
                })
                .count() as u64;
        }
        if compute.end as usize > table.len() * ps as usize {
            self.errors.push(IntegrityError::ShortPageTable {
                request: row.request_id.clone(),
                position: table.len() as u32 * ps,
            });
            return Ok(track);
        }
        for pos in compute.clone() {
            self.write_slot(view, &row.request_id, &track, table, pos)?;
            if (pos + 1) % ps == 0 {
                self.computed_pages
                    .entry(track.prefix[pos as usize])
                    .or_insert(self.steps);
            }
        }
        // Read after the writes, as attention does: a table that maps two positions to
        // one slot shows up as well as a stale or misplaced page.
        let mut digest = self.read(view, &row.request_id, &track, table, compute.end)?;
        // Group entries hold a running state (a compressor's): the row reads what the
        // rows before it left, then leaves its own.
        if let Some(groups) = &self.groups {
            let row = RowGroups {
                request: &row.request_id,
                tables: group_tables,
            };
            let before = groups.check_before(row, &track.prefix, compute.start, |p| {
                self.verified(p, compute.end)
            });
            let written = self
                .groups
                .as_mut()
                .and_then(|groups| groups.write(row, &track.prefix, compute.clone()));
            let after = self.groups.as_ref().and_then(|groups| {
                groups.read_after(row, &track.prefix, compute.end, &mut digest, |p| {
                    self.verified(p, compute.end)
                })
            });
            if let Some(wrong) = before.or(written).or(after) {
                self.errors.push(IntegrityError::WrongGroup(wrong));
            }
        }
        if let (Some(model), Some(states)) = (self.states, states) {
            digest ^= self.recur(states, model, row, &track, compute.clone())?;
        }
        if !engine_rule::yields_token(row) {
            return Ok(track);
        }
        // The token the engine rule asks for, derived from every word this row read.
        let token = 1 + (splitmix64(digest) % 32000) as Token;
        track.push(token);
        track.generated += 1;
        engine_rule::push_token(
            events,
            &row.request_id,
            token,
            track.generated,
            track.max_new,
        );
        Ok(track)
    }

    /// The recurrent part of a row computing `compute`: reads and checks the state of
    /// `0..compute.start` in the working slot (a fresh request starts from the empty
    /// state), writes the state after the row there, and the checkpoint the rule asks
    /// for. Returns how far the state read is from the right one (0 when it is right).
    fn recur(
        &mut self,
        view: &mut DeviceView<'_>,
        model: StateModel,
        row: &kvtier_types::ForwardRow,
        track: &Track,
        compute: std::ops::Range<u32>,
    ) -> Result<u64, DeviceError> {
        let state_of = |len: u32| -> u64 {
            if len == 0 {
                0x6b76_7469_6572
            } else {
                track.prefix[len as usize - 1]
            }
        };
        let words = (model.geometry.bytes_per_layer / 8) as usize;
        let (begin, end) = (compute.start, compute.end);
        let Some(working) = row.mamba.working else {
            self.errors.push(IntegrityError::WrongState(WrongState {
                request: row.request_id.clone(),
                slot: None,
                position: begin,
                found: 0,
            }));
            return Ok(0);
        };
        // What the row's state differs from the one it needs: nothing when it is right,
        // so a right state gives the same tokens however the history was chunked, and a
        // wrong one changes them (and every state after it).
        let mut delta = 0u64;
        if begin > 0 {
            let expected = state_of(begin);
            let mut found = None;
            for layer in 0..model.geometry.layers {
                let item = view.item(working + 1, layer, 0)?;
                for (w, chunk) in item.chunks_exact(8).take(words).enumerate() {
                    let word = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
                    let off = word ^ state_word(begin, expected, layer, w);
                    delta = (delta ^ off)
                        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                        .rotate_left(23);
                    if off != 0 && found.is_none() {
                        found = Some(u64::from_le_bytes(item[..8].try_into().unwrap_or([0; 8])));
                    }
                }
            }
            if let Some(found) = found.filter(|_| self.verify != Verify::Off) {
                self.errors.push(IntegrityError::WrongState(WrongState {
                    request: row.request_id.clone(),
                    slot: Some(working),
                    position: begin,
                    found,
                }));
            }
        }
        let mut write = |slot: u32, len: u32| -> Result<(), DeviceError> {
            let h = state_of(len);
            for layer in 0..model.geometry.layers {
                let item = view.item(slot + 1, layer, 0)?;
                for (w, chunk) in item.chunks_exact_mut(8).take(words).enumerate() {
                    let word = state_word(len, h, layer, w) ^ if w > 0 { delta } else { 0 };
                    chunk.copy_from_slice(&word.to_le_bytes());
                }
            }
            Ok(())
        };
        write(working, end)?;
        if let Some(checkpoint) = row.mamba.checkpoint_dst {
            let ps = self.geometry.page_size;
            let at = match row.kind {
                RowKind::Prefill => {
                    kvtier_mamba::checkpoint_depth(begin, end - begin, ps, model.chunk)
                }
                RowKind::Decode | RowKind::Recovery => {
                    kvtier_mamba::decode_checkpoint_depth(end, ps)
                }
            };
            if let Some(at) = at {
                write(checkpoint, at)?;
            }
        }
        Ok(delta)
    }

    fn write_slot(
        &mut self,
        view: &mut DeviceView<'_>,
        request: &RequestId,
        track: &Track,
        table: &[PageId],
        pos: u32,
    ) -> Result<(), DeviceError> {
        let h = track.prefix[pos as usize];
        let (ps, planes) = (self.geometry.page_size, self.geometry.planes);
        let page = table[(pos / ps) as usize];
        for (row, slot) in view.token_slots_mut(page, pos % ps)?.enumerate() {
            let (layer, plane) = (row as u32 / planes, row as u32 % planes);
            for (w, chunk) in slot.chunks_exact_mut(8).enumerate() {
                chunk.copy_from_slice(&kv_word(h, layer, plane, w).to_le_bytes());
            }
        }
        self.device_sources[page as usize] = DeviceSource::Computed(request.clone());
        Ok(())
    }

    /// Whether position `pos` is verified under the verify mode, for a row reading
    /// `0..end`.
    fn verified(&self, pos: u32, end: u32) -> bool {
        match self.verify {
            Verify::Off => false,
            Verify::Full => true,
            Verify::Sampled(n) | Verify::Sparse(n) => {
                pos.is_multiple_of(n.max(1)) || pos + 4 >= end
            }
        }
    }

    /// Reads every word of positions `0..end` (all layers and planes) into a digest,
    /// verifying the positions the verify mode picks; records the first wrong slot.
    fn read(
        &mut self,
        view: &mut DeviceView<'_>,
        request: &RequestId,
        track: &Track,
        table: &[PageId],
        end: u32,
    ) -> Result<u64, DeviceError> {
        let mut digest = track.salt;
        let mut wrong = None;
        // Sparse: every n-th position and the last few; else all of them.
        let (step, tail) = match self.verify {
            Verify::Sparse(n) => (n.max(1) as usize, end.saturating_sub(4)),
            _ => (1, end),
        };
        let ps = self.geometry.page_size;
        let planes = self.geometry.planes;
        for pos in (0..tail).step_by(step).chain(tail..end) {
            let check = wrong.is_none() && self.verified(pos, end);
            let h = track.prefix[pos as usize];
            let page = table[(pos / ps) as usize];
            // Every layer and plane of the position, layer by layer.
            for (row, slot) in view.token_slots(page, pos % ps)?.enumerate() {
                let (layer, plane) = (row as u32 / planes, row as u32 % planes);
                let mut good = true;
                for (w, chunk) in slot.chunks_exact(8).enumerate() {
                    let word = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
                    digest = (digest ^ word)
                        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                        .rotate_left(29);
                    good &= !check || word == kv_word(h, layer, plane, w);
                }
                if !good && wrong.is_none() {
                    wrong = Some(WrongKv {
                        request: request.clone(),
                        position: pos,
                        page,
                        tier: Tier::Device,
                        layer,
                        plane,
                        provenance: self.device_sources[page as usize].seen_by(request),
                    });
                }
            }
        }
        if let Some(wrong) = wrong {
            self.errors.push(IntegrityError::WrongKv(wrong));
        }
        Ok(digest)
    }

    fn host_source(&mut self, page: PageId) -> &mut HostSource {
        let page = page as usize;
        if page >= self.host_sources.len() {
            self.host_sources.resize(page + 1, HostSource::Unwritten);
        }
        &mut self.host_sources[page]
    }
}

impl ModelRunner for OracleEngine {
    fn admit(&mut self, requests: &[NewRequest]) {
        for r in requests {
            self.register(r.id.clone(), &r.prompt, r.max_new_tokens);
        }
    }

    fn written_back(&mut self, pairs: &[TransferPair]) {
        for pair in pairs.iter().filter(|p| p.kind == TransferKind::Kv) {
            *self.host_source(pair.dst) = HostSource::WrittenBack;
        }
    }

    fn loaded(&mut self, pairs: &[TransferPair]) {
        for pair in pairs.iter().filter(|p| p.kind == TransferKind::Kv) {
            let from = *self.host_source(pair.src);
            self.device_sources[pair.dst as usize] = DeviceSource::LoadedBack {
                host_page: pair.src,
                from,
            };
        }
    }

    fn load_failed(&mut self, pairs: &[TransferPair]) {
        for pair in pairs {
            match pair.kind {
                TransferKind::Kv => self.void_pages.insert(pair.dst),
                TransferKind::Mamba => self.void_states.insert(pair.dst),
            };
        }
    }

    fn forward(
        &mut self,
        plan: &ExecutionPlan,
        arenas: &mut KvArenas,
        events: &mut Vec<EngineEvent>,
    ) -> Result<(), DeviceError> {
        self.steps += 1;
        for notice in &plan.aborted {
            self.forget(&notice.request_id);
        }
        let void_pages = std::mem::take(&mut self.void_pages);
        let void_states = std::mem::take(&mut self.void_states);
        let (mut view, mut state_view) = arenas.device_views();
        for (index, row) in plan.forward.rows.iter().enumerate() {
            let table = plan.forward.page_table_of(row);
            let group_tables = plan.forward.groups_of(index);
            let copies_void = row.mamba.cow_src.is_some_and(|s| void_states.contains(&s));
            if copies_void || !void_pages.is_empty() && table.iter().any(|p| void_pages.contains(p))
            {
                // It would read a failed load-back: the scheduler runs it again later.
                self.void_rows += 1;
                continue;
            }
            let Some(track) = self.tracks.remove(&row.request_id) else {
                self.errors.push(IntegrityError::UnknownRequest {
                    request: row.request_id.clone(),
                });
                continue;
            };
            let track = self.forward_row(
                &mut view,
                state_view.as_mut(),
                row,
                (table, group_tables),
                track,
                events,
            )?;
            if track.generated < track.max_new {
                self.tracks.insert(row.request_id.clone(), track);
            } else {
                let out = track.tokens[track.tokens.len() - track.generated..].to_vec();
                self.outputs.insert(row.request_id.clone(), out);
            }
        }
        // L3 fills these host pages after this plan; the load-backs that read them come
        // in later plans.
        for prefetch in &plan.prefetches {
            for &page in &prefetch.dst_pages {
                *self.host_source(page) = HostSource::Prefetched;
            }
        }
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any + Send> {
        self
    }
}

/// Flips the first byte of one slot item of a device page (fault injection for tests).
pub fn corrupt(
    arenas: &mut KvArenas,
    page: PageId,
    layer: u32,
    plane: u32,
) -> Result<(), DeviceError> {
    let item = arenas.device_item(page, layer, plane)?;
    item[0] ^= 0xff;
    Ok(())
}
