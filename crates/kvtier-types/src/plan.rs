//! The execution plan the scheduler hands the engine each step.
//!
//! Forward rows are stored as an array of small row records plus flat buffers (page
//! tables, input ids) that rows index into, so one plan costs a handful of allocations
//! however many rows it has. Prefill rows always come before decode rows.

use crate::{OpId, PageId, RequestId, SlotId, Token, hash::PageHash};

/// What a forward row computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RowKind {
    /// A prompt chunk.
    Prefill,
    /// One decode step of a running request.
    Decode,
    /// The first decode step after a retracted request was resumed: a whole new
    /// page-table row (new slot) and an explicit input token.
    Recovery,
}

/// One row of the forward batch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ForwardRow {
    /// The request this row computes.
    pub request_id: RequestId,
    /// Prefill chunk, decode, or decode after recovery.
    pub kind: RowKind,
    /// Request-pool slot; stable from the first chunk to finish, new after recovery.
    pub slot: SlotId,
    /// Tokens computed by this row (chunk size, or `decode_input_tokens`).
    pub input_length: u32,
    /// Prompt length; 0 on recovery rows (as the reference reports it).
    pub prefill_length: u32,
    /// Where this row's page table starts in [`ForwardBatch::page_table`].
    pub pages_start: u32,
    /// Length of this row's page table (the request's occupied device pages).
    pub pages_len: u32,
    /// First newly appended page of the page table (index into the row's table).
    pub begin: u32,
    /// Number of newly appended pages.
    pub size: u32,
    /// Tokens already in KV before this chunk (prefill rows; 0 otherwise).
    pub extend_prefix_len: u32,
    /// Where this row's input ids start in [`ForwardBatch::input_ids`] (prefill rows).
    pub input_ids_start: u32,
    /// Explicit decode input token, or -1 when the engine uses the token it sampled last.
    pub decode_input_id: Token,
    /// History length for recovery rows, -1 otherwise.
    pub hist_token_len: i32,
    /// Recurrent-state slots of the row (hybrid models; all `None` otherwise).
    pub mamba: MambaRow,
}

/// A row's table of one paged-cache group ([`ForwardBatch::groups_of`]): its compact
/// view. The entry of token
/// position `p` sits on page `p / tokens_per_page`, which is `pages[that − base]`;
/// pages below `base` left the window (sliding groups) and are not the row's to read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct GroupTable {
    /// The first page the table still holds (0 for full-history groups).
    pub base: u32,
    /// The group's page ids from `base` on.
    pub pages: Vec<PageId>,
    /// A first chunk whose prefix came without this group's entries (a window model's
    /// KV from host or L3): the row computes the entries from this position up to its
    /// first one before its own (the window its first token attends). `None`: the
    /// entries before the row are in the table.
    pub fill_from: Option<u32>,
}

/// The recurrent-state (Mamba) part of a forward row (hybrid models).
///
/// The row reads its state from `working` (after copying `cow_src` into it when set) and
/// leaves its new state there; where the checkpoint rule says so
/// (`kvtier_mamba::checkpoint_depth`) it also copies a state into `checkpoint_dst`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct MambaRow {
    /// The request's live state slot.
    pub working: Option<SlotId>,
    /// Where this row may snapshot a state.
    pub checkpoint_dst: Option<SlotId>,
    /// A cached state to copy into `working` before the row runs (copy on write).
    pub cow_src: Option<SlotId>,
    /// Where a prefill chunk should also checkpoint (tokens from the prompt's start): the
    /// prefix cache matched KV that deep but had no state there.
    pub branching: Option<u32>,
}

impl MambaRow {
    /// Whether the row carries no state at all (a full-attention model).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// The forward part of a plan.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ForwardBatch {
    /// Prefill rows first (in scheduling order), then decode and recovery rows.
    pub rows: Vec<ForwardRow>,
    /// Number of prefill rows at the front of `rows`.
    pub num_prefill_rows: usize,
    /// Every row's occupied device pages, concatenated. Token `p` of a row lives in
    /// `page_table_of(row)[p / page_size]`.
    pub page_table: Vec<PageId>,
    /// Input ids of every prefill row, concatenated.
    pub input_ids: Vec<Token>,
    /// Each prefill row's input ids shifted by one (next-token targets), right-padded
    /// with -1 to the chunk length, concatenated.
    pub shifted_input_ids: Vec<Token>,
    /// Paged-cache models: every row's table of each group (in group-id byte order),
    /// the same number per row, in row order; empty otherwise.
    pub group_tables: Vec<GroupTable>,
}

impl ForwardBatch {
    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The full page table of `row`.
    pub fn page_table_of(&self, row: &ForwardRow) -> &[PageId] {
        let start = row.pages_start as usize;
        &self.page_table[start..start + row.pages_len as usize]
    }

    /// The group tables of the row at `index` (empty without paged-cache groups).
    pub fn groups_of(&self, index: usize) -> &[GroupTable] {
        let n = self.group_tables.len() / self.rows.len().max(1);
        self.group_tables
            .get(index * n..(index + 1) * n)
            .unwrap_or(&[])
    }

    /// The pages newly appended for `row` this step.
    pub fn new_pages_of(&self, row: &ForwardRow) -> &[PageId] {
        let table = self.page_table_of(row);
        &table[row.begin as usize..(row.begin + row.size) as usize]
    }

    /// The input ids of a prefill `row` (empty for decode rows).
    pub fn input_ids_of(&self, row: &ForwardRow) -> &[Token] {
        if row.kind != RowKind::Prefill {
            return &[];
        }
        let start = row.input_ids_start as usize;
        &self.input_ids[start..start + row.input_length as usize]
    }

    /// The shifted input ids of a prefill `row` (empty for decode rows).
    pub fn shifted_input_ids_of(&self, row: &ForwardRow) -> &[Token] {
        if row.kind != RowKind::Prefill {
            return &[];
        }
        let start = row.input_ids_start as usize;
        &self.shifted_input_ids[start..start + row.input_length as usize]
    }

    /// The prefill rows.
    pub fn prefill_rows(&self) -> &[ForwardRow] {
        &self.rows[..self.num_prefill_rows]
    }

    /// The decode and recovery rows.
    pub fn decode_rows(&self) -> &[ForwardRow] {
        &self.rows[self.num_prefill_rows..]
    }
}

/// What a transfer pair moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TransferKind {
    /// A KV page.
    Kv,
    /// A Mamba state slot (hybrid models).
    Mamba,
}

/// One page (or slot) copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TransferPair {
    /// What is copied.
    pub kind: TransferKind,
    /// Source page or slot.
    pub src: PageId,
    /// Destination page or slot.
    pub dst: PageId,
}

impl TransferPair {
    /// A KV page copy.
    pub fn kv(src: PageId, dst: PageId) -> Self {
        Self {
            kind: TransferKind::Kv,
            src,
            dst,
        }
    }
}

/// Device→host copies the engine must run and acknowledge with `WriteBackDone`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WriteBackOp {
    /// Acknowledge with this id.
    pub op_id: OpId,
    /// `src` = device page, `dst` = host page. A pair already emitted by an earlier op
    /// of the same plan is omitted here.
    pub pairs: Vec<TransferPair>,
    /// Written back because its request was retracted (else: because it finished).
    pub is_retract: bool,
}

/// Host→device copies that must land before this plan's forward reads them. Not
/// acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LoadBackOp {
    /// Op id (from the shared counter).
    pub op_id: OpId,
    /// `src` = host page, `dst` = device page; de-duplicated across the plan.
    pub pairs: Vec<TransferPair>,
}

/// L3→host fill of host pages, acknowledged with `PrefetchDone` (L3 tier).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PrefetchOp {
    /// Acknowledge with this id.
    pub op_id: OpId,
    /// The request waiting for these pages.
    pub request_id: RequestId,
    /// Host pages to fill, in page order.
    pub dst_pages: Vec<PageId>,
    /// Rolling hash of each page to fetch.
    pub page_hashes: Vec<PageHash>,
    /// Hybrid models: the recurrent state after the last page, into this host state
    /// slot. Pages are of no use without the state at their end: when that state (or a
    /// page) does not come back, the L3 actor falls back to the deepest earlier state
    /// it can read into the slot, and `completed_pages` counts the pages that state
    /// follows (0 when none).
    pub state: Option<StateObject>,
}

/// Host→L3 copy of written-back pages, acknowledged with `BackupDone` (L3 tier).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BackupOp {
    /// Acknowledge with this id.
    pub op_id: OpId,
    /// Host pages to store, in page order; pinned until the ack.
    pub src_pages: Vec<PageId>,
    /// Rolling hash of each page.
    pub page_hashes: Vec<PageHash>,
    /// Hybrid models: the recurrent states cached on those pages, each the state after
    /// the page its hash names; stored with them, all or nothing.
    pub states: Vec<StateObject>,
}

/// A recurrent state as one L3 object (hybrid models): a host state slot, and the rolling
/// hash of the page the state follows (its object is keyed by it, apart from the page's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StateObject {
    /// The host state slot.
    pub slot: u32,
    /// The rolling hash of the last page of the prefix the state follows.
    pub page_hash: PageHash,
}

/// Why the scheduler gave up on a request by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AbortReason {
    /// A retraction needed host pages and the host pool could not provide them.
    HostPoolExhausted,
    /// The request grew past what the whole device pool can hold, so it can never run
    /// again.
    ExceedsDevicePool,
    /// The request grew past what a paged-cache group's whole pool can hold.
    ExceedsGroupPool,
    /// A retracted hybrid request's path holds no recurrent state to resume from
    /// (`Policy::Reference` only: kvtier recomputes it instead).
    StateLost,
}

/// A request the scheduler aborted on its own; the engine must stop waiting for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AbortNotice {
    /// The aborted request (now unknown to the scheduler).
    pub request_id: RequestId,
    /// Why.
    pub reason: AbortReason,
}

/// Everything the engine must do this step.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ExecutionPlan {
    /// The forward batch (possibly without rows).
    pub forward: ForwardBatch,
    /// Write-backs: finish write-backs first, then the retract write-back.
    pub write_backs: Vec<WriteBackOp>,
    /// Load-backs, to complete before the forward reads their pages.
    pub load_backs: Vec<LoadBackOp>,
    /// L3 prefetches (L3 tier).
    pub prefetches: Vec<PrefetchOp>,
    /// L3 backups (L3 tier).
    pub backups: Vec<BackupOp>,
    /// Requests the scheduler aborted this step.
    pub aborted: Vec<AbortNotice>,
}

impl ExecutionPlan {
    /// Whether the plan holds nothing for the engine to do or learn.
    pub fn is_empty(&self) -> bool {
        self.forward.is_empty()
            && self.write_backs.is_empty()
            && self.load_backs.is_empty()
            && self.prefetches.is_empty()
            && self.backups.is_empty()
            && self.aborted.is_empty()
    }

    /// Total pages across the plan's write-backs.
    pub fn write_back_pages(&self) -> usize {
        self.write_backs.iter().map(|op| op.pairs.len()).sum()
    }

    /// Total pages across the plan's load-backs.
    pub fn load_back_pages(&self) -> usize {
        self.load_backs.iter().map(|op| op.pairs.len()).sum()
    }
}
