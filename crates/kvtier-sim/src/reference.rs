//! The reference engine: plays the model runner against real KV arenas and proves, slot by
//! slot, that every row reads the KV its tokens would have produced.
//!
//! * The KV of the token at position `i` of a sequence is a pure function of the token
//!   prefix `0..=i` (a rolling hash) and of the layer and plane. A computed token writes
//!   it into the slot the plan's page table gives: page `table[i / page_size]`, offset
//!   `i % page_size`.
//! * Before a row runs, the engine verifies the slots it reads (all of them, a sample, or
//!   none) and records the first wrong one with the request, position, page, layer and
//!   where that page's bytes last came from.
//! * The next token is derived from the KV bytes actually read, so misplaced, stale or
//!   corrupted KV also changes the output: a run with cache reuse must produce exactly the
//!   tokens of a run without it. Which rows yield a token, and when a request
//!   finishes, is [`kvtier_types::engine_rule`].
//!
//! It is a [`ModelRunner`]: the device actor runs each plan's load-backs and write-backs
//! on the arenas through the kernel library, then hands the forward rows to it.

use std::any::Any;
use std::collections::BTreeMap;

use kvtier_device::{DeviceCore, DeviceError, KvArenas, KvGeometry, ModelRunner, NewRequest};
use kvtier_types::{
    EngineEvent, ExecutionPlan, PageId, RequestId, RowKind, Tier, Token, TransferPair, engine_rule,
};

use crate::tokens::splitmix64;

/// How much of what a row reads is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// Every slot of every layer and plane.
    Full,
    /// Every `n`-th position plus the last few, first layer and plane.
    Sampled(u32),
    /// Nothing (the output still depends on the bytes read).
    Off,
}

impl Verify {
    /// `Sampled` at the interval a bare `sampled` means (the command line's): every 16th
    /// position.
    pub const SAMPLED: Verify = Verify::Sampled(16);
}

/// `full`, `sampled` ([`Verify::SAMPLED`]) or `off`. Written out because `Sampled`
/// carries its interval, which the derive cannot.
#[cfg(feature = "clap")]
impl clap::ValueEnum for Verify {
    fn value_variants<'a>() -> &'a [Self] {
        &[Verify::Full, Verify::SAMPLED, Verify::Off]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        let name = match self {
            Verify::Full => "full",
            Verify::Sampled(_) => "sampled",
            Verify::Off => "off",
        };
        Some(clap::builder::PossibleValue::new(name))
    }
}

/// Where a device page's bytes last came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provenance {
    /// Never written since allocation.
    Fresh,
    /// Written by a forward of this engine.
    Computed,
    /// Loaded back from this host page.
    LoadedFromHost(PageId),
}

/// The first wrong KV slot a row read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntegrityError {
    /// The request whose row read it.
    pub request: RequestId,
    /// Token position.
    pub position: u32,
    /// Device page.
    pub page: PageId,
    /// Layer.
    pub layer: u32,
    /// Where the page's bytes last came from.
    pub provenance: Provenance,
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

/// The reference engine.
#[derive(Debug)]
pub struct ReferenceEngine {
    geometry: KvGeometry,
    verify: Verify,
    provenance: Vec<Provenance>,
    tracks: BTreeMap<RequestId, Track>,
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
}

/// Bytes of one token in one (layer, plane): one slot.
fn slot_bytes(g: &KvGeometry) -> usize {
    (g.item_bytes() / u64::from(g.page_size)) as usize
}

/// The KV word `w` of a slot whose prefix hash is `h`.
fn kv_word(h: u64, layer: u32, plane: u32, w: usize) -> u64 {
    splitmix64(h ^ (u64::from(layer) << 40) ^ (u64::from(plane) << 36) ^ w as u64)
}

impl ReferenceEngine {
    /// An engine for a device pool of `device_pages` (page 0 included). Slots must be
    /// whole 8-byte words.
    pub fn new(
        geometry: KvGeometry,
        device_pages: u32,
        verify: Verify,
    ) -> Result<Self, DeviceError> {
        if !slot_bytes(&geometry).is_multiple_of(8) || slot_bytes(&geometry) == 0 {
            return Err(DeviceError::InvalidGeometry(
                "the reference engine needs token slots of whole 8-byte words".into(),
            ));
        }
        Ok(Self {
            geometry,
            verify,
            provenance: vec![Provenance::Fresh; device_pages as usize],
            tracks: BTreeMap::new(),
            errors: Vec::new(),
            outputs: BTreeMap::new(),
            steps: 0,
            computed_pages: std::collections::HashMap::new(),
            ideal_hit_pages: 0,
        })
    }

    /// A device core over fresh arenas for pools of `device_pages` and `host_pages`
    /// (page 0 included), with this engine as its model runner.
    pub fn into_device(self, host_pages: u32) -> Result<DeviceCore, DeviceError> {
        let device_pages = self.provenance.len() as u32;
        let arenas = KvArenas::new(self.geometry, device_pages, host_pages.max(2), 2)?;
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

    fn forward_row(
        &mut self,
        arenas: &mut KvArenas,
        row: &kvtier_types::ForwardRow,
        table: &[PageId],
        mut track: Track,
        events: &mut Vec<EngineEvent>,
    ) -> Result<Track, DeviceError> {
        // Positions already in KV that this row reads, and those it computes.
        let (read_end, compute) = match row.kind {
            RowKind::Prefill => {
                let begin = row.extend_prefix_len;
                (begin, begin..begin + row.input_length)
            }
            RowKind::Decode | RowKind::Recovery => {
                let last = track.tokens.len() as u32 - 1;
                (last, last..last + 1)
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
        self.check(arenas, &row.request_id, &track, table, read_end);
        for pos in compute.clone() {
            self.write_slot(arenas, &track, table, pos)?;
            if (pos + 1) % ps == 0 {
                self.computed_pages
                    .entry(track.prefix[pos as usize])
                    .or_insert(self.steps);
            }
        }
        if !engine_rule::yields_token(row) {
            return Ok(track);
        }
        // The token the engine rule asks for, derived from the KV this row read.
        let token = self.next_token(arenas, &track, table, compute.end)?;
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

    fn slot<'a>(
        &self,
        arenas: &'a mut KvArenas,
        table: &[PageId],
        pos: u32,
        layer: u32,
        plane: u32,
    ) -> Result<(PageId, &'a mut [u8]), DeviceError> {
        let ps = self.geometry.page_size;
        let page = *table
            .get((pos / ps) as usize)
            .ok_or(DeviceError::PageOutOfRange {
                tier: Tier::Device,
                page: 0,
                pages: table.len() as u32,
            })?;
        let bytes = slot_bytes(&self.geometry);
        let item = arenas.device_item(page, layer, plane)?;
        let at = (pos % ps) as usize * bytes;
        Ok((page, &mut item[at..at + bytes]))
    }

    fn write_slot(
        &mut self,
        arenas: &mut KvArenas,
        track: &Track,
        table: &[PageId],
        pos: u32,
    ) -> Result<(), DeviceError> {
        let h = track.prefix[pos as usize];
        for layer in 0..self.geometry.layers {
            for plane in 0..self.geometry.planes {
                let (page, slot) = self.slot(arenas, table, pos, layer, plane)?;
                for (w, chunk) in slot.chunks_exact_mut(8).enumerate() {
                    chunk.copy_from_slice(&kv_word(h, layer, plane, w).to_le_bytes());
                }
                self.provenance[page as usize] = Provenance::Computed;
            }
        }
        Ok(())
    }

    /// Verifies positions `0..end` per the verify mode; records the first bad slot.
    fn check(
        &mut self,
        arenas: &mut KvArenas,
        id: &RequestId,
        track: &Track,
        table: &[PageId],
        end: u32,
    ) {
        let (positions, layers): (Vec<u32>, u32) = match self.verify {
            Verify::Off => return,
            Verify::Full => ((0..end).collect(), self.geometry.layers),
            Verify::Sampled(n) => {
                let n = n.max(1);
                let tail = end.saturating_sub(4);
                ((0..end).filter(|p| p % n == 0 || *p >= tail).collect(), 1)
            }
        };
        for pos in positions {
            let h = track.prefix[pos as usize];
            for layer in 0..layers {
                for plane in 0..self.geometry.planes {
                    let Ok((page, slot)) = self.slot(arenas, table, pos, layer, plane) else {
                        self.errors.push(IntegrityError {
                            request: id.clone(),
                            position: pos,
                            page: 0,
                            layer,
                            provenance: Provenance::Fresh,
                        });
                        return;
                    };
                    let good = slot
                        .chunks_exact(8)
                        .enumerate()
                        .all(|(w, c)| c == kv_word(h, layer, plane, w).to_le_bytes());
                    if !good {
                        let provenance = self.provenance[page as usize];
                        self.errors.push(IntegrityError {
                            request: id.clone(),
                            position: pos,
                            page,
                            layer,
                            provenance,
                        });
                        return;
                    }
                }
            }
        }
    }

    /// The next token: a digest of the KV read at every position before `end` (first
    /// word of layer 0, plane 0 — attention reads them all) and the request's salt.
    fn next_token(
        &self,
        arenas: &mut KvArenas,
        track: &Track,
        table: &[PageId],
        end: u32,
    ) -> Result<Token, DeviceError> {
        let mut h = track.salt;
        for pos in 0..end {
            let (_, slot) = self.slot(arenas, table, pos, 0, 0)?;
            let word = u64::from_le_bytes(slot[..8].try_into().unwrap_or([0; 8]));
            h = (h ^ word)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .rotate_left(29);
        }
        Ok(1 + (splitmix64(h) % 32000) as Token)
    }
}

impl ModelRunner for ReferenceEngine {
    fn admit(&mut self, requests: &[NewRequest]) {
        for r in requests {
            self.register(r.id.clone(), &r.prompt, r.max_new_tokens);
        }
    }

    fn loaded(&mut self, pairs: &[TransferPair]) {
        for pair in pairs {
            self.provenance[pair.dst as usize] = Provenance::LoadedFromHost(pair.src);
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
        for row in &plan.forward.rows {
            let table = plan.forward.page_table_of(row);
            let Some(track) = self.tracks.remove(&row.request_id) else {
                continue;
            };
            let track = self.forward_row(arenas, row, table, track, events)?;
            if track.generated < track.max_new {
                self.tracks.insert(row.request_id.clone(), track);
            } else {
                let out = track.tokens[track.tokens.len() - track.generated..].to_vec();
                self.outputs.insert(row.request_id.clone(), out);
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

/// Overwrites one byte of a device page (fault injection for tests).
pub fn corrupt(arenas: &mut KvArenas, page: PageId) -> Result<(), DeviceError> {
    let item = arenas.device_item(page, 0, 0)?;
    item[0] ^= 0xff;
    Ok(())
}
