//! The three FNV-1a digests of a hybrid run's plans (§2): rows, transfers and decisions,
//! over a canonical order of each plan's copies.

use kvtier_types::{ExecutionPlan, ForwardRow, RowKind, TransferKind, TransferPair, WriteBackOp};

use crate::digest::Fnv;

/// The decision and page digests, fed plan by plan, and the one that also pins the
/// paged groups' page ids (`digest_all`, informational: the reference frees group pages
/// in hash-table order).
#[derive(Debug)]
pub(super) struct Digests {
    pub(super) decisions: Fnv,
    pub(super) pages: Fnv,
    pub(super) all: Fnv,
    /// The paged groups' ids, in byte order (the rows' group order).
    groups: Vec<String>,
}

/// A transfer op split by kind: (KV src, KV dst, state src, state dst).
type Split = [Vec<i64>; 4];

pub(super) fn split(pairs: &[TransferPair]) -> Split {
    let mut out: Split = Default::default();
    for p in pairs {
        let base = match p.kind {
            TransferKind::Kv => 0,
            TransferKind::Mamba => 2,
        };
        out[base].push(i64::from(p.src));
        out[base + 1].push(i64::from(p.dst));
    }
    out
}

/// Write-backs in the canonical order of the engine rule: ascending first KV source page,
/// then the KV source list.
pub(super) fn canonical(write_backs: &[WriteBackOp]) -> Vec<(&WriteBackOp, Split)> {
    let mut ops: Vec<(&WriteBackOp, Split)> = write_backs
        .iter()
        .map(|op| (op, split(&op.pairs)))
        .collect();
    ops.sort_by(|(_, a), (_, b)| {
        (a[0].first().copied().unwrap_or(-1), &a[0])
            .cmp(&(b[0].first().copied().unwrap_or(-1), &b[0]))
    });
    ops
}

/// The row fields the digest pins, in its order.
fn row_fields(row: &ForwardRow, pages: usize) -> [i64; 11] {
    let prefill = row.kind == RowKind::Prefill;
    [
        i64::from(!prefill),
        i64::from(row.input_length),
        i64::from(row.prefill_length),
        if prefill {
            i64::from(row.extend_prefix_len)
        } else {
            i64::from(row.hist_token_len)
        },
        i64::from(row.begin),
        i64::from(row.size),
        pages as i64,
        slot_or_none(row.mamba.working),
        slot_or_none(row.mamba.checkpoint_dst),
        slot_or_none(row.mamba.cow_src),
        slot_or_none(row.mamba.branching),
    ]
}

/// A slot or length as the digest writes it: -1 for none.
fn slot_or_none(v: Option<u32>) -> i64 {
    v.map_or(-1, i64::from)
}

impl Digests {
    pub(super) fn new(groups: Vec<String>) -> Self {
        Self {
            decisions: Fnv::new(),
            pages: Fnv::new(),
            all: Fnv::new(),
            groups,
        }
    }

    /// Feeds every digest.
    pub(super) fn both(&mut self, f: impl Fn(&mut Fnv)) {
        f(&mut self.decisions);
        f(&mut self.pages);
        f(&mut self.all);
    }

    /// Feeds the digests that pin device and host page ids.
    fn page_ids(&mut self, list: &[i64]) {
        self.pages.v(list);
        self.all.v(list);
    }

    /// Feeds one plan; returns its line for `record_plans`.
    pub(super) fn plan(&mut self, plan: &ExecutionPlan) -> String {
        let forward = &plan.forward;
        let rows = forward.rows.len() as i64;
        let prefill = forward.num_prefill_rows as i64;
        self.both(|d| {
            d.i(rows);
            d.i(prefill);
        });
        // Write-backs.
        let ops = canonical(&plan.write_backs);
        let mut shapes: Vec<[i64; 3]> = ops
            .iter()
            .map(|(op, s)| {
                [
                    i64::from(op.is_retract),
                    s[0].len() as i64,
                    s[2].len() as i64,
                ]
            })
            .collect();
        shapes.sort_unstable();
        self.both(|d| {
            d.i(ops.len() as i64);
            for shape in &shapes {
                for &x in shape {
                    d.i(x);
                }
            }
        });
        for (_, s) in &ops {
            for list in s {
                self.page_ids(list);
            }
        }
        // Load-backs, in plan order.
        self.both(|d| d.i(plan.load_backs.len() as i64));
        let mut load_backs = Vec::with_capacity(plan.load_backs.len());
        for op in &plan.load_backs {
            let s = split(&op.pairs);
            self.both(|d| {
                d.i(s[0].len() as i64);
                d.i(s[2].len() as i64);
            });
            for list in &s {
                self.page_ids(list);
            }
            load_backs.push([s[0].len(), s[2].len()]);
        }
        // Rows.
        let mut row_lines = Vec::with_capacity(forward.rows.len());
        for (index, row) in forward.rows.iter().enumerate() {
            let row_groups = forward.groups_of(index);
            let table: Vec<i64> = forward
                .page_table_of(row)
                .iter()
                .map(|&p| i64::from(p))
                .collect();
            let fields = row_fields(row, table.len());
            self.both(|d| {
                d.s(row.request_id.as_str());
                for &x in &fields {
                    d.i(x);
                }
            });
            self.page_ids(&table);
            let mut group_fields = Vec::with_capacity(row_groups.len());
            for (i, g) in row_groups.iter().enumerate() {
                let Some(id) = self.groups.get(i).cloned() else {
                    break;
                };
                self.both(|d| {
                    d.s(&id);
                    d.i(g.pages.len() as i64);
                    d.i(i64::from(g.base));
                });
                let ids: Vec<i64> = g.pages.iter().map(|&p| i64::from(p)).collect();
                self.all.v(&ids);
                group_fields.push(format!(
                    "\"{id}\": {{\"ids\": {ids:?}, \"base\": {}}}",
                    g.base
                ));
            }
            let groups_json = if group_fields.is_empty() {
                String::new()
            } else {
                format!(", {{{}}}", group_fields.join(", "))
            };
            row_lines.push(format!(
                "[\"{}\", {}, {}, {:?}{groups_json}]",
                row.request_id.as_str(),
                i64::from(row.kind == RowKind::Prefill),
                fields[1..]
                    .iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                table
            ));
        }
        let mut wbs: Vec<(i64, &Split)> = ops
            .iter()
            .map(|(op, s)| (i64::from(op.is_retract), s))
            .collect();
        wbs.sort();
        let wbs: Vec<String> = wbs
            .iter()
            .map(|(r, s)| format!("[{r}, {:?}, {:?}, {:?}, {:?}]", s[0], s[1], s[2], s[3]))
            .collect();
        let lbs: Vec<String> = load_backs
            .iter()
            .map(|s| format!("[{}, {}]", s[0], s[1]))
            .collect();
        format!(
            "\"rows\": [{}], \"wbs\": [{}], \"lbs\": [{}]",
            row_lines.join(", "),
            wbs.join(", "),
            lbs.join(", ")
        )
    }
}
