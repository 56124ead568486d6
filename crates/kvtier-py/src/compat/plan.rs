//! `ExecutionPlan`, its forward op (structure of arrays) and its cache ops, as views of
//! kvtier's plan: each property builds fresh Python lists, as the reference's do.

use std::collections::BTreeMap;
use std::sync::Arc;

use kvtier_types::{ForwardRow, TransferKind, TransferPair};
use pyo3::prelude::*;

/// What every view of one plan shares.
#[derive(Debug, Default)]
pub struct PlanData {
    pub plan: kvtier_types::ExecutionPlan,
    /// The paged-cache groups, in kvtier's (byte) order, and whether each slides.
    pub groups: Arc<[(String, bool)]>,
}

/// One scheduling step: the forward batch and the cache copies around it.
#[pyclass(module = "tokenspeed_scheduler")]
#[derive(Debug, Default)]
pub struct ExecutionPlan {
    pub data: Arc<PlanData>,
}

#[pymethods]
impl ExecutionPlan {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    /// Exactly one `Forward.FlatForwardOp` (possibly without rows).
    #[getter]
    fn forward(&self, py: Python<'_>) -> PyResult<Vec<Py<FlatForwardOp>>> {
        Ok(vec![Py::new(
            py,
            FlatForwardOp {
                data: Arc::clone(&self.data),
                hist_token_lens: None,
            },
        )?])
    }

    /// A `Cache.WriteBackOp` holding every write-back (if any), then a `Cache.LoadBackOp`
    /// holding every load-back (if any), then one `Cache.PrefetchOp` per L3 prefetch and
    /// one `Cache.BackUpOp` per L3 backup.
    #[getter]
    fn cache(&self, py: Python<'_>) -> PyResult<Vec<Py<PyAny>>> {
        let plan = &self.data.plan;
        let mut ops = Vec::new();
        if !plan.write_backs.is_empty() {
            let op = WriteBackOp {
                op_ids: plan.write_backs.iter().map(|op| op.op_id).collect(),
                pairs: plan.write_backs.iter().map(|op| op.pairs.clone()).collect(),
                is_retract: plan.write_backs.iter().map(|op| op.is_retract).collect(),
            };
            ops.push(Py::new(py, op)?.into_any());
        }
        if !plan.load_backs.is_empty() {
            let op = LoadBackOp {
                op_ids: plan.load_backs.iter().map(|op| op.op_id).collect(),
                pairs: plan.load_backs.iter().map(|op| op.pairs.clone()).collect(),
            };
            ops.push(Py::new(py, op)?.into_any());
        }
        for op in &plan.prefetches {
            let op = PrefetchOp {
                op_id: op.op_id,
                request_id: op.request_id.as_str().to_owned(),
                src_pages: Vec::new(),
                dst_pages: op.dst_pages.clone(),
                rolling_page_hashes: op.page_hashes.iter().map(|h| h.to_hex()).collect(),
            };
            ops.push(Py::new(py, op)?.into_any());
        }
        for op in &plan.backups {
            let op = BackUpOp {
                op_id: op.op_id,
                src_pages: op.src_pages.clone(),
                dst_pages: Vec::new(),
                rolling_page_hashes: op.page_hashes.iter().map(|h| h.to_hex()).collect(),
            };
            ops.push(Py::new(py, op)?.into_any());
        }
        Ok(ops)
    }

    /// kvtier's addition: `(request_id, reason)` of the requests the scheduler gave up on
    /// this step (the reference drops them without a word).
    #[getter]
    fn aborted(&self) -> Vec<(String, String)> {
        self.data
            .plan
            .aborted
            .iter()
            .map(|a| (a.request_id.as_str().to_owned(), format!("{:?}", a.reason)))
            .collect()
    }
}

/// The forward batch as flat arrays, one entry per row (prefill rows first).
#[pyclass(module = "tokenspeed_scheduler.Forward")]
#[derive(Debug)]
pub struct FlatForwardOp {
    data: Arc<PlanData>,
    /// Set on this copy only (the reference's property is writable on a copy).
    hist_token_lens: Option<Vec<i32>>,
}

fn option_id(id: Option<u32>) -> i64 {
    id.map_or(-1, i64::from)
}

impl FlatForwardOp {
    fn rows(&self) -> &[ForwardRow] {
        &self.data.plan.forward.rows
    }

    fn per_row<'a, T>(&'a self, f: impl Fn(&'a ForwardRow) -> T) -> Vec<T> {
        self.rows().iter().map(f).collect()
    }

    fn decode_rows(&self) -> &[ForwardRow] {
        self.data.plan.forward.decode_rows()
    }
}

#[pymethods]
impl FlatForwardOp {
    fn __repr__(&self) -> String {
        let ids: Vec<String> = self
            .request_ids()
            .iter()
            .map(|id| format!("'{id}'"))
            .collect();
        format!(
            "FlatForwardOp(request_ids=[{}], request_pool_indices={:?}, input_lengths={:?}, \
             occupied_pages={:?}, begins={:?}, sizes={:?}, input_ids={:?}, shifted_input_ids={:?}, \
             extend_prefix_lens={:?}, num_extends={})",
            ids.join(", "),
            self.request_pool_indices(),
            self.input_lengths(),
            self.occupied_pages(),
            self.begins(),
            self.sizes(),
            self.input_ids(),
            self.shifted_input_ids(),
            self.extend_prefix_lens(),
            self.num_extends(),
        )
    }

    #[getter]
    fn request_ids(&self) -> Vec<&str> {
        self.per_row(|r| r.request_id.as_str())
    }

    #[getter]
    fn request_pool_indices(&self) -> Vec<u32> {
        self.per_row(|r| r.slot)
    }

    #[getter]
    fn input_lengths(&self) -> Vec<u32> {
        self.per_row(|r| r.input_length)
    }

    #[getter]
    fn prefill_lengths(&self) -> Vec<u32> {
        self.per_row(|r| r.prefill_length)
    }

    #[getter]
    fn occupied_pages(&self) -> Vec<&[u32]> {
        let forward = &self.data.plan.forward;
        self.per_row(|r| forward.page_table_of(r))
    }

    #[getter]
    fn begins(&self) -> Vec<u32> {
        self.per_row(|r| r.begin)
    }

    #[getter]
    fn sizes(&self) -> Vec<u32> {
        self.per_row(|r| r.size)
    }

    #[getter]
    fn new_occupied_pages(&self) -> Vec<&[u32]> {
        let forward = &self.data.plan.forward;
        self.per_row(|r| forward.new_pages_of(r))
    }

    #[getter]
    fn input_ids(&self) -> &[i32] {
        &self.data.plan.forward.input_ids
    }

    #[getter]
    fn shifted_input_ids(&self) -> &[i32] {
        &self.data.plan.forward.shifted_input_ids
    }

    #[getter]
    fn extend_prefix_lens(&self) -> Vec<u32> {
        let forward = &self.data.plan.forward;
        forward
            .prefill_rows()
            .iter()
            .map(|r| r.extend_prefix_len)
            .collect()
    }

    fn num_extends(&self) -> usize {
        self.data.plan.forward.num_prefill_rows
    }

    #[getter]
    fn decode_input_ids(&self) -> Vec<i32> {
        self.decode_rows()
            .iter()
            .map(|r| r.decode_input_id)
            .collect()
    }

    #[getter]
    fn hist_token_lens(&self) -> Vec<i32> {
        match &self.hist_token_lens {
            Some(set) => set.clone(),
            None => self
                .decode_rows()
                .iter()
                .map(|r| r.hist_token_len)
                .collect(),
        }
    }

    #[setter]
    fn set_hist_token_lens(&mut self, lens: Vec<i32>) {
        self.hist_token_lens = Some(lens);
    }

    /// Per group, every row's table from its base page, padded with -1 to the widest
    /// (empty without rows, as the reference's).
    #[getter]
    fn paged_cache_block_tables(&self) -> BTreeMap<&str, Vec<Vec<i64>>> {
        let forward = &self.data.plan.forward;
        let mut tables = BTreeMap::new();
        if forward.rows.is_empty() {
            return tables;
        }
        for (g, (id, _)) in self.data.groups.iter().enumerate() {
            let rows: Vec<&[u32]> = (0..forward.rows.len())
                .map(|i| {
                    forward
                        .groups_of(i)
                        .get(g)
                        .map_or(&[][..], |t| &t.pages[..])
                })
                .collect();
            let width = rows.iter().map(|r| r.len()).max().unwrap_or(0);
            let padded = rows
                .iter()
                .map(|pages| {
                    let mut row: Vec<i64> = pages.iter().map(|&p| i64::from(p)).collect();
                    row.resize(width, -1);
                    row
                })
                .collect();
            tables.insert(id.as_str(), padded);
        }
        tables
    }

    /// Per sliding group, every row's base page (empty without rows).
    #[getter]
    fn paged_cache_block_table_base_offsets(&self) -> BTreeMap<&str, Vec<u32>> {
        let forward = &self.data.plan.forward;
        let mut bases = BTreeMap::new();
        if forward.rows.is_empty() {
            return bases;
        }
        for (g, (id, sliding)) in self.data.groups.iter().enumerate() {
            if *sliding {
                let row_bases = (0..forward.rows.len())
                    .map(|i| forward.groups_of(i).get(g).map_or(0, |t| t.base))
                    .collect();
                bases.insert(id.as_str(), row_bases);
            }
        }
        bases
    }

    #[getter]
    fn mamba_pool_indices(&self) -> Vec<i64> {
        self.per_row(|r| option_id(r.mamba.working))
    }

    #[getter]
    fn mamba_checkpoint_dst_indices(&self) -> Vec<i64> {
        self.per_row(|r| option_id(r.mamba.checkpoint_dst))
    }

    /// The same data as `mamba_checkpoint_dst_indices`.
    #[getter]
    fn mamba_track_pool_indices(&self) -> Vec<i64> {
        self.mamba_checkpoint_dst_indices()
    }

    #[getter]
    fn mamba_cow_src_indices(&self) -> Vec<i64> {
        self.per_row(|r| option_id(r.mamba.cow_src))
    }

    #[getter]
    fn mamba_branching_seqlens(&self) -> Vec<i64> {
        self.per_row(|r| option_id(r.mamba.branching))
    }
}

/// Each op's pages of one kind, source or destination side.
fn side(pairs: &[Vec<TransferPair>], kind: TransferKind, src: bool) -> Vec<Vec<u32>> {
    pairs
        .iter()
        .map(|op| {
            op.iter()
                .filter(|p| p.kind == kind)
                .map(|p| if src { p.src } else { p.dst })
                .collect()
        })
        .collect()
}

fn by_kind(pairs: &[Vec<TransferPair>], src: bool) -> BTreeMap<&'static str, Vec<Vec<u32>>> {
    BTreeMap::from([
        ("kv", side(pairs, TransferKind::Kv, src)),
        ("mamba", side(pairs, TransferKind::Mamba, src)),
    ])
}

/// The page views both flattened copy ops offer: KV pages per op on each side (`src`:
/// device for a write-back, host for a load-back), and both kinds keyed by name.
macro_rules! copy_op_views {
    ($op:ty) => {
        #[pymethods]
        impl $op {
            #[getter]
            fn src_pages(&self) -> Vec<Vec<u32>> {
                side(&self.pairs, TransferKind::Kv, true)
            }

            #[getter]
            fn dst_pages(&self) -> Vec<Vec<u32>> {
                side(&self.pairs, TransferKind::Kv, false)
            }

            #[getter]
            fn src_pages_by_kind(&self) -> BTreeMap<&'static str, Vec<Vec<u32>>> {
                by_kind(&self.pairs, true)
            }

            #[getter]
            fn dst_pages_by_kind(&self) -> BTreeMap<&'static str, Vec<Vec<u32>>> {
                by_kind(&self.pairs, false)
            }
        }
    };
}

/// Every device→host copy of the plan, one entry per op; acknowledge each op id with
/// `Cache.WriteBackDoneEvent`.
#[pyclass(module = "tokenspeed_scheduler.Cache")]
#[derive(Debug)]
pub struct WriteBackOp {
    #[pyo3(get)]
    op_ids: Vec<u32>,
    pairs: Vec<Vec<TransferPair>>,
    #[pyo3(get)]
    is_retract: Vec<bool>,
}

copy_op_views!(WriteBackOp);

/// Every host→device copy of the plan, to finish before its forward runs.
#[pyclass(module = "tokenspeed_scheduler.Cache")]
#[derive(Debug)]
pub struct LoadBackOp {
    #[pyo3(get)]
    op_ids: Vec<u32>,
    pairs: Vec<Vec<TransferPair>>,
}

copy_op_views!(LoadBackOp);

/// An L3→host fetch for a waiting request; acknowledge with `Cache.PrefetchDoneEvent`.
#[pyclass(module = "tokenspeed_scheduler.Cache", get_all)]
#[derive(Debug, Default)]
pub struct PrefetchOp {
    op_id: u32,
    request_id: String,
    src_pages: Vec<u32>,
    dst_pages: Vec<u32>,
    rolling_page_hashes: Vec<String>,
}

#[pymethods]
impl PrefetchOp {
    #[new]
    fn new() -> Self {
        Self::default()
    }
}

/// A host→L3 store of written-back pages (kvtier acknowledges it with its own
/// `BackupDone`; the reference never emits one).
#[pyclass(module = "tokenspeed_scheduler.Cache", get_all)]
#[derive(Debug, Default)]
pub struct BackUpOp {
    op_id: u32,
    src_pages: Vec<u32>,
    dst_pages: Vec<u32>,
    rolling_page_hashes: Vec<String>,
}

#[pymethods]
impl BackUpOp {
    #[new]
    fn new() -> Self {
        Self::default()
    }
}
