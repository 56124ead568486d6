//! `Plan` and its parts: forward rows, cache copies, L3 ops, and KV events, as read-only
//! views of kvtier's plan.

use std::collections::BTreeMap;
use std::sync::Arc;

use kvtier_types::{ExecutionPlan, ForwardRow, Medium, RowKind, TransferKind, TransferPair};
use pyo3::prelude::*;

/// What the engine runs this step.
#[pyclass(module = "kvtier", frozen)]
#[derive(Debug)]
pub struct Plan {
    plan: Arc<ExecutionPlan>,
    /// The paged-cache group ids, in the order rows carry their tables.
    groups: Arc<[String]>,
}

impl Plan {
    pub fn new(plan: ExecutionPlan, groups: Arc<[String]>) -> Self {
        Self {
            plan: Arc::new(plan),
            groups,
        }
    }
}

#[pymethods]
impl Plan {
    /// Forward rows: prefill chunks first, then decode (and recovery) rows.
    #[getter]
    fn rows(&self, py: Python<'_>) -> PyResult<Vec<Py<Row>>> {
        (0..self.plan.forward.rows.len())
            .map(|index| {
                Py::new(
                    py,
                    Row {
                        plan: Arc::clone(&self.plan),
                        groups: Arc::clone(&self.groups),
                        index,
                    },
                )
            })
            .collect()
    }

    /// Device→host copies; acknowledge each with `WriteBackDone`.
    #[getter]
    fn write_backs(&self) -> Vec<Copy> {
        self.plan
            .write_backs
            .iter()
            .map(|op| Copy::new(op.op_id, &op.pairs, Some(op.is_retract)))
            .collect()
    }

    /// Host→device copies, to finish before the forward reads their pages.
    #[getter]
    fn load_backs(&self) -> Vec<Copy> {
        self.plan
            .load_backs
            .iter()
            .map(|op| Copy::new(op.op_id, &op.pairs, None))
            .collect()
    }

    /// L3→host fills; acknowledge each with `PrefetchDone`.
    #[getter]
    fn prefetches(&self) -> Vec<Prefetch> {
        self.plan
            .prefetches
            .iter()
            .map(|op| Prefetch {
                op_id: op.op_id,
                request_id: op.request_id.as_str().to_owned(),
                dst_pages: op.dst_pages.clone(),
                page_hashes: op.page_hashes.iter().map(|h| h.to_hex()).collect(),
            })
            .collect()
    }

    /// Host→L3 stores; acknowledge each with `BackupDone`.
    #[getter]
    fn backups(&self) -> Vec<Backup> {
        self.plan
            .backups
            .iter()
            .map(|op| Backup {
                op_id: op.op_id,
                src_pages: op.src_pages.clone(),
                page_hashes: op.page_hashes.iter().map(|h| h.to_hex()).collect(),
            })
            .collect()
    }

    /// `(request_id, reason)` of requests the scheduler gave up on this step.
    #[getter]
    fn aborted(&self) -> Vec<(String, String)> {
        self.plan
            .aborted
            .iter()
            .map(|a| (a.request_id.as_str().to_owned(), format!("{:?}", a.reason)))
            .collect()
    }

    /// Whether there is nothing to run, copy or learn.
    fn is_empty(&self) -> bool {
        self.plan.is_empty()
    }

    fn __len__(&self) -> usize {
        self.plan.forward.rows.len()
    }

    fn __repr__(&self) -> String {
        let p = &self.plan;
        format!(
            "Plan(rows={}, prefill_rows={}, write_backs={}, load_backs={}, prefetches={}, backups={}, aborted={})",
            p.forward.rows.len(),
            p.forward.num_prefill_rows,
            p.write_backs.len(),
            p.load_backs.len(),
            p.prefetches.len(),
            p.backups.len(),
            p.aborted.len()
        )
    }
}

/// One forward row.
#[pyclass(module = "kvtier", frozen)]
#[derive(Debug)]
pub struct Row {
    plan: Arc<ExecutionPlan>,
    groups: Arc<[String]>,
    index: usize,
}

impl Row {
    fn row(&self) -> &ForwardRow {
        &self.plan.forward.rows[self.index]
    }
}

fn optional(value: i32) -> Option<i32> {
    (value >= 0).then_some(value)
}

#[pymethods]
impl Row {
    #[getter]
    fn request_id(&self) -> &str {
        self.row().request_id.as_str()
    }

    /// `"prefill"`, `"decode"`, or `"recovery"` (the first decode after a retraction).
    #[getter]
    fn kind(&self) -> &'static str {
        match self.row().kind {
            RowKind::Prefill => "prefill",
            RowKind::Decode => "decode",
            RowKind::Recovery => "recovery",
        }
    }

    /// Request-pool slot.
    #[getter]
    fn slot(&self) -> u32 {
        self.row().slot
    }

    /// Tokens this row computes.
    #[getter]
    fn input_length(&self) -> u32 {
        self.row().input_length
    }

    /// Prompt length (0 on recovery rows).
    #[getter]
    fn prefill_length(&self) -> u32 {
        self.row().prefill_length
    }

    /// Tokens already in KV before this chunk (prefill rows).
    #[getter]
    fn extend_prefix_len(&self) -> u32 {
        self.row().extend_prefix_len
    }

    /// The request's device pages: token `p` lives on `pages[p // page_size]`.
    #[getter]
    fn pages(&self) -> &[u32] {
        self.plan.forward.page_table_of(self.row())
    }

    /// Pages newly appended this step (`pages[begin:begin + size]`).
    #[getter]
    fn new_pages(&self) -> &[u32] {
        self.plan.forward.new_pages_of(self.row())
    }

    #[getter]
    fn begin(&self) -> u32 {
        self.row().begin
    }

    #[getter]
    fn size(&self) -> u32 {
        self.row().size
    }

    /// The chunk's tokens (prefill rows; empty otherwise).
    #[getter]
    fn input_ids(&self) -> &[i32] {
        self.plan.forward.input_ids_of(self.row())
    }

    /// The chunk's next-token targets, -1 past the prompt (prefill rows).
    #[getter]
    fn shifted_input_ids(&self) -> &[i32] {
        self.plan.forward.shifted_input_ids_of(self.row())
    }

    /// An explicit decode input token, or None when the engine feeds its last sample.
    #[getter]
    fn decode_input_id(&self) -> Option<i32> {
        optional(self.row().decode_input_id)
    }

    /// History length of a recovery row, else None.
    #[getter]
    fn hist_token_len(&self) -> Option<i32> {
        optional(self.row().hist_token_len)
    }

    /// Recurrent-state slots (hybrid models): `working`, `checkpoint_dst`, `cow_src`,
    /// `branching`, each None when unused.
    #[getter]
    fn mamba(&self) -> BTreeMap<&'static str, Option<u32>> {
        let m = self.row().mamba;
        BTreeMap::from([
            ("working", m.working),
            ("checkpoint_dst", m.checkpoint_dst),
            ("cow_src", m.cow_src),
            ("branching", m.branching),
        ])
    }

    /// Paged-cache models: group id → `(base, pages, fill_from)`.
    #[getter]
    fn group_tables(&self) -> BTreeMap<&str, (u32, Vec<u32>, Option<u32>)> {
        self.groups
            .iter()
            .zip(self.plan.forward.groups_of(self.index))
            .map(|(id, t)| (id.as_str(), (t.base, t.pages.clone(), t.fill_from)))
            .collect()
    }

    fn __repr__(&self) -> String {
        let r = self.row();
        format!(
            "Row({:?}, {}, input_length={}, pages={:?})",
            r.request_id.as_str(),
            self.kind(),
            r.input_length,
            self.pages()
        )
    }
}

/// A copy op: its id and `(kind, src, dst)` pairs (`kind` is `"kv"` or `"mamba"`).
#[pyclass(module = "kvtier", frozen, get_all)]
#[derive(Debug, Clone)]
pub struct Copy {
    op_id: u32,
    pairs: Vec<(&'static str, u32, u32)>,
    /// Write-backs: whether a retraction (else a finish) made it; None on load-backs.
    is_retract: Option<bool>,
}

impl Copy {
    fn new(op_id: u32, pairs: &[TransferPair], is_retract: Option<bool>) -> Self {
        let kind = |k| match k {
            TransferKind::Kv => "kv",
            TransferKind::Mamba => "mamba",
        };
        Self {
            op_id,
            pairs: pairs.iter().map(|p| (kind(p.kind), p.src, p.dst)).collect(),
            is_retract,
        }
    }
}

#[pymethods]
impl Copy {
    /// Source pages of the KV pairs.
    #[getter]
    fn src_pages(&self) -> Vec<u32> {
        self.pairs
            .iter()
            .filter(|p| p.0 == "kv")
            .map(|p| p.1)
            .collect()
    }

    /// Destination pages of the KV pairs.
    #[getter]
    fn dst_pages(&self) -> Vec<u32> {
        self.pairs
            .iter()
            .filter(|p| p.0 == "kv")
            .map(|p| p.2)
            .collect()
    }

    fn __repr__(&self) -> String {
        format!("Copy(op_id={}, pairs={})", self.op_id, self.pairs.len())
    }
}

/// An L3→host fill for a waiting request.
#[pyclass(module = "kvtier", frozen, get_all)]
#[derive(Debug, Clone)]
pub struct Prefetch {
    op_id: u32,
    request_id: String,
    dst_pages: Vec<u32>,
    page_hashes: Vec<String>,
}

/// A host→L3 store of written-back pages.
#[pyclass(module = "kvtier", frozen, get_all)]
#[derive(Debug, Clone)]
pub struct Backup {
    op_id: u32,
    src_pages: Vec<u32>,
    page_hashes: Vec<String>,
}

/// A KV-cache event (vLLM's `BlockStored` / `BlockRemoved`) on one tier.
#[pyclass(module = "kvtier", frozen, get_all)]
#[derive(Debug, Clone)]
pub struct KvEvent {
    /// `"BlockStored"` or `"BlockRemoved"`.
    kind: &'static str,
    block_hashes: Vec<u64>,
    parent_block_hash: Option<u64>,
    token_ids: Vec<i32>,
    block_size: Option<u32>,
    /// `"GPU"`, `"CPU"` or `"DISK"` (vLLM's medium names).
    medium: &'static str,
}

#[pymethods]
impl KvEvent {
    fn __repr__(&self) -> String {
        format!(
            "KvEvent({}, {}, hashes={:?})",
            self.kind, self.medium, self.block_hashes
        )
    }
}

fn medium(m: Medium) -> &'static str {
    match m {
        Medium::Device => "GPU",
        Medium::Host => "CPU",
        Medium::Storage => "DISK",
    }
}

impl From<kvtier_types::KvEvent> for KvEvent {
    fn from(event: kvtier_types::KvEvent) -> Self {
        match event {
            kvtier_types::KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                medium: m,
            } => Self {
                kind: "BlockStored",
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size: Some(block_size),
                medium: medium(m),
            },
            kvtier_types::KvEvent::BlockRemoved {
                block_hashes,
                medium: m,
            } => Self {
                kind: "BlockRemoved",
                block_hashes,
                parent_block_hash: None,
                token_ids: Vec::new(),
                block_size: None,
                medium: medium(m),
            },
            // A kind this binding does not know yet.
            #[allow(unreachable_patterns)]
            _ => Self {
                kind: "Unknown",
                block_hashes: Vec::new(),
                parent_block_hash: None,
                token_ids: Vec::new(),
                block_size: None,
                medium: "GPU",
            },
        }
    }
}
