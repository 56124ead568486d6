//! A plan under construction: the rows of its forward batch, the transfer pairs it has
//! emitted, its candidates and what each asked the cache for. [`Awaiting`] holds it
//! between the plan's batches; `step/` fills it.

use std::collections::HashSet;
use std::collections::hash_map::{self, HashMap};
use std::time::Instant;

use kvtier_types::{
    ExecutionPlan, ForwardRow, GroupTable, MambaRow, OpId, RowKind, Token, TransferPair,
};

use crate::outbox::Target;
use crate::request::{LocalKv, Republish, Request, Running};

/// Rows and flat buffers of the forward batch under construction.
#[derive(Debug, Default)]
pub(crate) struct Rows {
    pub prefill: Vec<ForwardRow>,
    pub decode: Vec<ForwardRow>,
    pub page_table: Vec<u32>,
    pub input_ids: Vec<Token>,
    pub shifted_input_ids: Vec<Token>,
    /// Paged models: the prefill rows' and the decode rows' group tables, in row order.
    pub prefill_groups: Vec<GroupTable>,
    pub decode_groups: Vec<GroupTable>,
}

impl Rows {
    /// Appends a running request's page table (tree prefix, then its own pages); returns
    /// where it starts and its length.
    fn push_page_table(&mut self, run: &Running) -> (u32, u32) {
        let start = self.page_table.len() as u32;
        self.page_table.extend_from_slice(&run.prefix_pages);
        self.page_table.extend_from_slice(run.local_kv.pages.ids());
        (start, run.occupied_len() as u32)
    }

    /// A decode row of `input_length` tokens over the request's whole page table, new from
    /// `begin`. A recovery row (new slot after retraction) also names its input token and
    /// history length, and reports prefill length 0 as the reference does; `cow_src` is
    /// the cached state it starts from (hybrid models).
    pub fn push_decode_row(
        &mut self,
        request: &Request,
        run: &Running,
        kind: RowKind,
        begin: u32,
        input_length: u32,
        cow_src: Option<u32>,
    ) {
        let (pages_start, pages_len) = self.push_page_table(run);
        let recovery = kind == RowKind::Recovery;
        self.decode.push(ForwardRow {
            request_id: request.id.clone(),
            kind,
            slot: run.slot.id(),
            input_length,
            prefill_length: if recovery { 0 } else { request.prefill_len },
            pages_start,
            pages_len,
            begin,
            size: pages_len - begin,
            extend_prefix_len: 0,
            input_ids_start: 0,
            decode_input_id: if recovery {
                request.tokens.last().copied().unwrap_or(-1)
            } else {
                -1
            },
            hist_token_len: if recovery {
                request.tokens.len() as i32 - 1
            } else {
                -1
            },
            mamba: mamba_row(run, cow_src, None),
        });
    }

    /// A prefill row for the request's current window, its page table new from `begin`;
    /// a first chunk of a hybrid model names the cached state it starts from and where
    /// it should also checkpoint.
    pub fn push_prefill_row(
        &mut self,
        request: &Request,
        run: &Running,
        begin: u32,
        cow_src: Option<u32>,
        branching: Option<u32>,
    ) {
        let (wb, ws) = (run.window_begin as usize, run.window_size as usize);
        let (pages_start, pages_len) = self.push_page_table(run);
        let input_ids_start = self.input_ids.len() as u32;
        self.input_ids
            .extend_from_slice(&request.tokens[wb..wb + ws]);
        let shifted_end = (wb + 1 + ws).min(request.prefill_len as usize);
        let shifted = &request.tokens[(wb + 1).min(shifted_end)..shifted_end];
        self.shifted_input_ids.extend_from_slice(shifted);
        self.shifted_input_ids
            .extend(std::iter::repeat_n(-1, ws - shifted.len()));
        self.prefill.push(ForwardRow {
            request_id: request.id.clone(),
            kind: RowKind::Prefill,
            slot: run.slot.id(),
            input_length: run.window_size,
            prefill_length: request.prefill_len,
            pages_start,
            pages_len,
            begin,
            size: pages_len - begin,
            extend_prefix_len: run.window_begin,
            input_ids_start,
            decode_input_id: -1,
            hist_token_len: -1,
            mamba: mamba_row(run, cow_src, branching),
        });
    }

    /// Gives the row just pushed (a prefill or a decode row) its group tables (every
    /// row of a paged model has one per group).
    pub fn set_groups(&mut self, prefill: bool, groups: Vec<GroupTable>) {
        if groups.is_empty() {
            return;
        }
        let tables = if prefill {
            &mut self.prefill_groups
        } else {
            &mut self.decode_groups
        };
        tables.extend(groups);
    }
}

/// A row's state slots: the request's working slot, its checkpoint (only with a working
/// slot, as the reference sends them), and the row's copy source and branching length.
fn mamba_row(run: &Running, cow_src: Option<u32>, branching: Option<u32>) -> MambaRow {
    let Some(states) = run.family.states() else {
        return MambaRow::default();
    };
    MambaRow {
        working: Some(states.working.id()),
        checkpoint_dst: states.checkpoint.as_ref().map(|s| s.id()),
        cow_src,
        branching,
    }
}

/// Transfer pairs already emitted in this plan, per direction (a pair is emitted once).
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// Each write-back pair emitted, with the op that carries it.
    write_back: HashMap<TransferPair, OpId>,
    load_back: HashSet<TransferPair>,
}

impl Seen {
    /// The pairs of write-back `op` not yet emitted by this plan's earlier write-backs,
    /// and those earlier ops (sorted) that carry the rest: `op`'s copy is only whole if
    /// they succeed too.
    pub fn new_write_back_pairs(
        &mut self,
        op: OpId,
        pairs: Vec<TransferPair>,
    ) -> (Vec<TransferPair>, Vec<OpId>) {
        let mut carried_by = Vec::new();
        let mine = pairs
            .into_iter()
            .filter(|pair| match self.write_back.entry(*pair) {
                hash_map::Entry::Vacant(slot) => {
                    slot.insert(op);
                    true
                }
                hash_map::Entry::Occupied(earlier) => {
                    carried_by.push(*earlier.get());
                    false
                }
            })
            .collect();
        carried_by.sort_unstable();
        carried_by.dedup();
        (mine, carried_by)
    }

    /// The pairs of a load-back not yet emitted by this plan's earlier load-backs.
    pub fn new_load_back_pairs(&mut self, pairs: Vec<TransferPair>) -> Vec<TransferPair> {
        dedup(&mut self.load_back, pairs)
    }
}

fn dedup(seen: &mut HashSet<TransferPair>, pairs: Vec<TransferPair>) -> Vec<TransferPair> {
    pairs.into_iter().filter(|p| seen.insert(*p)).collect()
}

/// A candidate of the step and what it asked the cache for.
#[derive(Debug)]
pub(crate) enum Entry {
    /// No intent (a state that waits this step).
    None,
    /// A next chunk; a hybrid one commits its last chunk (`Some`).
    NextChunk(Option<Box<Republish>>),
    FirstChunk,
    /// A decode; a hybrid request's first one commits its last prefill chunk (`Some`).
    Decode(Option<Box<Republish>>),
    /// A retracted request: its state is out while its locks travel with the intent
    /// (boxed: a step's entries are mostly decodes, and this one is large).
    Recovery(Box<Resume>),
}

/// What a retracted request keeps outside the tree while its recovery is tried.
#[derive(Debug)]
pub(crate) struct Resume {
    /// Free slots in its last kept page (the pages travel with the intent).
    pub tail_free: u32,
    pub published_pages: u32,
    /// Paged models under the reference policies: its group tables, kept.
    pub tables: Option<kvtier_radix::GroupTables>,
}

/// A plan between its batches.
#[derive(Debug)]
pub(crate) struct PlanInProgress {
    pub plan: ExecutionPlan,
    pub seen: Seen,
    pub rows: Rows,
    /// The candidates' request keys, in scheduling order.
    pub candidates: Vec<usize>,
    /// What each candidate asked the cache for (taken when the outcomes are applied).
    pub entries: Vec<Entry>,
    /// Targets of the ops before the step's own op.
    pub targets: Vec<Target>,
    /// The retraction in flight, if this is the second batch.
    pub retract: Option<Retraction>,
    pub started: Instant,
}

/// A request being retracted by a plan's second batch: what it keeps while the cache
/// publishes its pages and moves its prefix to host.
#[derive(Debug)]
pub(crate) struct Retraction {
    pub key: usize,
    /// Its own device pages past the published ones.
    pub local_kv: LocalKv,
    /// Its pages published in the tree.
    pub published_pages: u32,
    /// Paged models under the reference policies: its group tables, kept.
    pub tables: Option<kvtier_radix::GroupTables>,
}

/// What the core is waiting for.
#[derive(Debug, Default)]
pub(crate) enum Awaiting {
    /// Nothing: the next call may start.
    #[default]
    Nothing,
    /// The reply to a batch of advance ops.
    Ops(Vec<Target>),
    /// The reply to a plan's batch.
    Plan(Box<PlanInProgress>),
}
