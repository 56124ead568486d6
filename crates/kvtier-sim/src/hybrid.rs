//! The hybrid benchmark workloads H1, H2 and H3, exactly as `design/HYBRID-WORKLOADS.md`
//! defines them: the conversation model, the step loop with its abort rule, the engine
//! rules, the plan-observable counters and the three FNV-1a digests (§2), so a run can be
//! compared with the reference scheduler counter for counter and plan for plan.

use std::collections::{BTreeMap, BTreeSet};

use kvtier::LocalSystem;
use kvtier_model::ModelSpec;
use kvtier_paged::PoolBudget;
use kvtier_types::{
    EngineEvent, ExecutionPlan, ForwardRow, GroupRole, MambaSettings, PagedSettings, Policy,
    RequestId, RequestSpec, RowKind, SchedulerConfig, Token, TransferKind, TransferPair,
    WriteBackOp, engine_rule,
};
use serde::Serialize;

use crate::api::{Path, scheduler_on};
use crate::digest::Fnv;
use crate::engine::{measured_advance, measured_next_plan, measured_submit};
use crate::tokens::{gen_tokens, tag};
use crate::workloads::WorkloadError;

/// A hybrid workload and its configuration variant (§1.2, §1.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum HybridVariant {
    /// H1 as defined: host tier and Mamba host copies on.
    #[cfg_attr(feature = "clap", value(name = "h1-main"))]
    H1Main,
    /// H1 on the device only: heavy Mamba eviction.
    #[cfg_attr(feature = "clap", value(name = "h1-noL2"))]
    H1NoL2,
    /// H1 with a smaller device pool: retractions with recovery.
    #[cfg_attr(feature = "clap", value(name = "h1-retract"))]
    H1Retract,
    /// H1 with 32 host state slots: host state eviction.
    #[cfg_attr(feature = "clap", value(name = "h1-tighthost"))]
    H1TightHost,
    /// H1 with 48 device state slots: retractions for want of state slots.
    #[cfg_attr(feature = "clap", value(name = "h1-starved"))]
    H1Starved,
    /// H3: eight requests under state-slot exhaustion.
    #[cfg_attr(feature = "clap", value(name = "h3-main"))]
    H3Main,
    /// H2: DeepSeek-V4's paged-cache groups at production pool sizes.
    #[cfg_attr(feature = "clap", value(name = "h2-main"))]
    H2Main,
    /// H2 with larger sliding pools.
    #[cfg_attr(feature = "clap", value(name = "h2-roomy"))]
    H2Roomy,
}

/// The paged-cache side of H2 (§1.3): the groups TokenSpeed builds for DeepSeek-V4
/// (`sliding_window = 128`, compress ratios {4, 128}; the `deepseek-v4-flash` preset),
/// pools sized by its formula for 16 live requests, 4,096 scheduled tokens, 160 × 256
/// total tokens and a 32,768-token context (`h2-roomy`: 1,024 more pages for each
/// sliding group). The reference policy requires the history groups only (as TokenSpeed
/// at 350cf505), kvtier's the state groups too (PR381), so a prefix is reusable at any
/// complete snapshot rather than only at a terminal one.
fn h2_paged(roomy: bool, policy: Policy) -> PagedSettings {
    let budget = PoolBudget {
        max_live_requests: 16,
        max_scheduled_tokens: 4096,
        max_total_tokens: 160 * 256,
        max_context_len: 32_768,
        sliding_safety_margin: if roomy { 1024 } else { 0 },
    };
    let spec = ModelSpec::preset("deepseek-v4-flash");
    debug_assert!(spec.is_ok(), "a built-in preset: {spec:?}");
    let mut paged = spec
        .ok()
        .and_then(|spec| spec.paged_settings(256, &budget))
        .unwrap_or_default();
    if policy.is_reference() {
        let history: Vec<String> = paged
            .groups
            .iter()
            .filter(|g| g.role == GroupRole::History)
            .map(|g| g.id.clone())
            .collect();
        paged.required.retain(|id| history.contains(id));
    }
    paged
}

impl HybridVariant {
    /// Its name in the workload definition.
    pub fn name(self) -> &'static str {
        match self {
            HybridVariant::H1Main => "h1-main",
            HybridVariant::H1NoL2 => "h1-noL2",
            HybridVariant::H1Retract => "h1-retract",
            HybridVariant::H1TightHost => "h1-tighthost",
            HybridVariant::H1Starved => "h1-starved",
            HybridVariant::H3Main => "h3-main",
            HybridVariant::H2Main => "h2-main",
            HybridVariant::H2Roomy => "h2-roomy",
        }
    }

    fn shape(self) -> Shape {
        match self {
            HybridVariant::H3Main => Shape {
                w: 9,
                num_sys: 0,
                sys_len: 0,
                conversations: 8,
                turns: 1,
                user_len: 300,
                gen_len: 80,
            },
            HybridVariant::H2Main | HybridVariant::H2Roomy => Shape {
                w: 8,
                num_sys: 4,
                sys_len: 6000,
                conversations: 16,
                turns: 4,
                user_len: 300,
                gen_len: 200,
            },
            _ => Shape {
                w: 7,
                num_sys: 4,
                sys_len: 1000,
                conversations: 32,
                turns: 6,
                user_len: 200,
                gen_len: 100,
            },
        }
    }

    /// The scheduler configuration of the variant under `policy`.
    pub fn config(self, policy: Policy) -> SchedulerConfig {
        let base = SchedulerConfig {
            page_size: 64,
            decode_input_tokens: 1,
            enable_l3_storage: false,
            enable_kv_cache_events: false,
            // The reference publishes plain models' prefixes at finish only.
            publish_prefix_mid_flight: false,
            ..SchedulerConfig::default()
        };
        let states = |device_slots, host_slots| {
            Some(MambaSettings {
                device_slots,
                host_slots,
                chunk: 64,
            })
        };
        let h1 = SchedulerConfig {
            device_pages: 385,
            host_pages: 257,
            max_scheduled_tokens: 2048,
            max_batch_size: 16,
            mamba: states(64, 256),
            ..base.clone()
        };
        match self {
            HybridVariant::H1Main => h1,
            HybridVariant::H1TightHost => SchedulerConfig {
                mamba: states(64, 32),
                ..h1
            },
            HybridVariant::H1Starved => SchedulerConfig {
                mamba: states(48, 256),
                ..h1
            },
            HybridVariant::H1NoL2 => SchedulerConfig {
                device_pages: 513,
                host_pages: 0,
                disable_l2_cache: true,
                mamba: states(96, 0),
                ..h1
            },
            HybridVariant::H1Retract => SchedulerConfig {
                device_pages: 321,
                ..h1
            },
            HybridVariant::H3Main => SchedulerConfig {
                device_pages: 257,
                host_pages: 257,
                max_scheduled_tokens: 8192,
                max_batch_size: 8,
                mamba: states(16, 256),
                ..base
            },
            // No host tier: V4's KV pool cannot have one.
            HybridVariant::H2Main | HybridVariant::H2Roomy => SchedulerConfig {
                page_size: 256,
                device_pages: 161,
                host_pages: 0,
                disable_l2_cache: true,
                max_scheduled_tokens: 4096,
                max_batch_size: 16,
                paged: Some(h2_paged(self == HybridVariant::H2Roomy, policy)),
                ..base
            },
        }
    }
}

/// The conversation model's parameters (§1.1).
#[derive(Debug, Clone, Copy)]
struct Shape {
    w: u64,
    num_sys: usize,
    sys_len: usize,
    conversations: usize,
    turns: usize,
    user_len: usize,
    gen_len: usize,
}

/// Knobs of a hybrid run.
#[derive(Debug, Clone)]
pub struct HybridOptions {
    /// Which workload and configuration.
    pub variant: HybridVariant,
    /// The path the workload drives.
    pub path: Path,
    /// kvtier's decisions, or the reference's (reproduces its counters and digests).
    pub policy: Policy,
    /// Record one line per plan (the decisions the digest pins), to compare with the
    /// reference's plans step by step.
    pub record_plans: bool,
}

impl HybridOptions {
    /// The variant as defined, through the cores.
    pub fn new(variant: HybridVariant) -> Self {
        Self {
            variant,
            path: Path::Core,
            policy: Policy::Default,
            record_plans: false,
        }
    }
}

/// The plan-observable counters of §2.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HybridCounters {
    /// Steps of the loop (flush plans not included).
    pub steps: u64,
    /// Plans of the flush, the last (empty) one included.
    pub flush_plans: u64,
    /// Turns defined.
    pub turns: u64,
    /// Requests that received Finish.
    pub finished: u64,
    /// Turns dropped by the abort rule.
    pub aborted: u64,
    /// Prefill rows.
    pub prefill_rows: u64,
    /// Prefill rows that were a request's first chunk.
    pub first_chunks: u64,
    /// Prefill rows that were not.
    pub later_chunks: u64,
    /// Decode rows, recovery rows included.
    pub decode_rows: u64,
    /// Decode rows that resumed a retracted request.
    pub retract_recover_rows: u64,
    /// Σ input length of prefill rows.
    pub prefill_tokens: u64,
    /// Σ input length of decode rows.
    pub decode_tokens: u64,
    /// Prompt tokens submitted.
    pub prompt_tokens: u64,
    /// Σ extend-prefix length of first chunks.
    pub hit_tokens: u64,
    /// Hit tokens loaded back from host (page size × KV load-back pages in plans with
    /// prefill rows).
    pub host_hit_tokens: u64,
    /// The rest of the hit tokens.
    pub device_hit_tokens: u64,
    /// Load-back ops.
    pub loadback_ops: u64,
    /// KV pages loaded back.
    pub loadback_kv_pages: u64,
    /// State slots loaded back.
    pub loadback_mamba: u64,
    /// Write-back ops.
    pub writeback_ops: u64,
    /// KV pages written back.
    pub writeback_kv_pages: u64,
    /// State slots written back.
    pub writeback_mamba: u64,
    /// Write-back ops of retractions.
    pub retract_writeback_ops: u64,
    /// Their KV pages.
    pub retract_writeback_kv_pages: u64,
    /// Their state slots.
    pub retract_writeback_mamba: u64,
    /// Fewest free device pages after a step.
    pub min_device_free_pages: u64,
    /// Free device pages at the end.
    pub device_free_pages_end: u64,
}

/// One paged group's counters (§2 `groups.<id>.*`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GroupCounters {
    /// Pool size, page 0 included.
    pub total_pages: u64,
    /// Free pages at the end.
    pub free_end: u64,
    /// Allocations the pool refused.
    pub failed_alloc: u64,
    /// Usable pages still held at the end (by snapshots).
    pub held_end: u64,
    /// Σ live entries over all rows.
    pub row_pages: u64,
    /// Most live entries of one row.
    pub max_row_pages: u64,
    /// Largest base offset of a row.
    pub max_base_offset: u64,
}

/// The paged-cache family's counters at the end of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PagedCounters {
    /// Snapshots built by commits.
    pub snapshots_created: u64,
    /// Commits that adopted another request's snapshot.
    pub snapshots_adopted: u64,
    /// Terminal snapshots completed with their continuation groups.
    pub terminal_continuations: u64,
    /// Admission prunes of state only.
    pub prune_state_only: u64,
    /// Admission prunes of whole snapshots.
    pub prune_full: u64,
    /// Descendants dropped with them.
    pub prune_cascade: u64,
    /// Snapshots dropped with their node's device KV.
    pub dropped_kv_evict: u64,
    /// Refused group admissions (attempts).
    pub admission_denied: u64,
    /// Superseded state windows detached (#460).
    pub stale_state_detached: u64,
    /// Snapshots held at the end.
    pub snapshots_end: u64,
    /// Requests' group tables still held at the end (0: only snapshots hold pages).
    pub tables_end: u64,
}

/// The result of a hybrid run.
#[derive(Debug, Clone, Serialize)]
pub struct HybridReport {
    /// The variant.
    pub workload: &'static str,
    /// The path the run drove.
    pub path: &'static str,
    /// `default` or `reference`.
    pub policy: &'static str,
    /// The counters.
    #[serde(flatten)]
    pub counters: HybridCounters,
    /// The decision digest (§2): every decision, every state slot, no page id.
    pub digest: String,
    /// The page digest: also device and host page ids.
    pub digest_pages: String,
    /// Paged models: also the groups' page ids (informational, §2).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest_all: Option<String>,
    /// Paged models: the family's counters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paged: Option<PagedCounters>,
    /// Paged models: per group, by id.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub groups: BTreeMap<String, GroupCounters>,
    /// Nanoseconds inside the timed calls (`measured_*`, the calls callgrind counts).
    pub measured_ns: u64,
    /// What `cargo xtask bench --callgrind` divides the count by: steps.
    pub callgrind_divisor: u64,
    /// One line per plan (with `record_plans`): its rows (the digest's fields, then the
    /// page table), write-backs (retract flag, KV and state pairs) and load-backs.
    #[serde(skip)]
    pub plans: Vec<String>,
}

/// The decision and page digests, fed plan by plan, and the one that also pins the
/// paged groups' page ids (`digest_all`, informational: the reference frees group pages
/// in hash-table order).
#[derive(Debug)]
struct Digests {
    decisions: Fnv,
    pages: Fnv,
    all: Fnv,
    /// The paged groups' ids, in byte order (the rows' group order).
    groups: Vec<String>,
}

/// A transfer op split by kind: (KV src, KV dst, state src, state dst).
type Split = [Vec<i64>; 4];

fn split(pairs: &[TransferPair]) -> Split {
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
fn canonical(write_backs: &[WriteBackOp]) -> Vec<(&WriteBackOp, Split)> {
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
    fn new(groups: Vec<String>) -> Self {
        Self {
            decisions: Fnv::new(),
            pages: Fnv::new(),
            all: Fnv::new(),
            groups,
        }
    }

    /// Feeds every digest.
    fn both(&mut self, f: impl Fn(&mut Fnv)) {
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
    fn plan(&mut self, plan: &ExecutionPlan) -> String {
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

/// One conversation of the workload.
#[derive(Debug)]
struct Conversation {
    history: Vec<Token>,
    next_turn: usize,
    ready: u64,
    live: Option<RequestId>,
}

/// A live turn.
#[derive(Debug)]
struct Turn {
    conversation: usize,
    user: Vec<Token>,
    stream: Vec<Token>,
    produced: usize,
}

/// The workload state between steps.
#[derive(Debug)]
struct Run {
    shape: Shape,
    system: LocalSystem,
    conversations: Vec<Conversation>,
    turns: BTreeMap<RequestId, Turn>,
    /// Requests that had a prefill row (their next prefill row is a later chunk).
    started: BTreeSet<RequestId>,
    /// Aborts the plan announced, seen by the engine one step later (§1.1).
    aborts_seen_next_step: Vec<RequestId>,
    counters: HybridCounters,
    digests: Digests,
    /// Per paged group, by id.
    groups: BTreeMap<String, GroupCounters>,
    plans: Option<Vec<String>>,
    page_size: u64,
    measured_ns: u64,
}

impl Run {
    fn submit_ready(&mut self, step: u64) -> Result<(), WorkloadError> {
        let s = self.shape;
        let mut batch = Vec::new();
        for (c, conv) in self.conversations.iter_mut().enumerate() {
            if conv.live.is_some() || conv.next_turn >= s.turns || conv.ready > step {
                continue;
            }
            let t = conv.next_turn;
            let i = (c * s.turns + t) as u64;
            let user = gen_tokens(tag(s.w, 2, i), s.user_len);
            let stream = gen_tokens(tag(s.w, 3, i), s.gen_len);
            let id = RequestId::from(format!("c{c:03}t{}", t + 1));
            let mut prompt = conv.history.clone();
            prompt.extend_from_slice(&user);
            self.counters.prompt_tokens += prompt.len() as u64;
            batch.push(RequestSpec::new(id.clone(), prompt));
            conv.live = Some(id.clone());
            self.turns.insert(
                id,
                Turn {
                    conversation: c,
                    user,
                    stream,
                    produced: 0,
                },
            );
        }
        if !batch.is_empty() {
            let t0 = std::time::Instant::now();
            // The hybrid workloads run without L3: no lookup to settle.
            measured_submit(&mut self.system, batch, false)?;
            self.measured_ns += t0.elapsed().as_nanos() as u64;
        }
        Ok(())
    }

    /// Builds and answers one plan; returns whether it held anything for the engine,
    /// and the requests that finished.
    fn plan_and_answer(&mut self) -> Result<(bool, Vec<RequestId>), WorkloadError> {
        let t0 = std::time::Instant::now();
        let plan = measured_next_plan(&mut self.system)?;
        self.measured_ns += t0.elapsed().as_nanos() as u64;
        let line = self.digests.plan(&plan);
        if self.plans.is_some() {
            // Free device pages right after the plan, as the reference reports them.
            let free = self.device_free()?;
            if let Some(plans) = &mut self.plans {
                plans.push(format!("{line}, \"free\": {free}"));
            }
        }
        self.count(&plan);
        self.aborts_seen_next_step
            .extend(plan.aborted.iter().map(|n| n.request_id.clone()));
        let has_work = !plan.forward.rows.is_empty() || !plan.write_backs.is_empty();
        let mut finished = Vec::new();
        if has_work {
            let events = self.answer(&plan, &mut finished)?;
            let t0 = std::time::Instant::now();
            measured_advance(&mut self.system, events)?;
            self.measured_ns += t0.elapsed().as_nanos() as u64;
        }
        Ok((has_work, finished))
    }

    fn count(&mut self, plan: &ExecutionPlan) {
        let c = &mut self.counters;
        let has_prefill = plan.forward.num_prefill_rows > 0;
        for op in &plan.write_backs {
            let s = split(&op.pairs);
            c.writeback_ops += 1;
            c.writeback_kv_pages += s[0].len() as u64;
            c.writeback_mamba += s[2].len() as u64;
            if op.is_retract {
                c.retract_writeback_ops += 1;
                c.retract_writeback_kv_pages += s[0].len() as u64;
                c.retract_writeback_mamba += s[2].len() as u64;
            }
        }
        for op in &plan.load_backs {
            let s = split(&op.pairs);
            c.loadback_ops += 1;
            c.loadback_kv_pages += s[0].len() as u64;
            c.loadback_mamba += s[2].len() as u64;
            if has_prefill {
                c.host_hit_tokens += self.page_size * s[0].len() as u64;
            }
        }
        for (index, row) in plan.forward.rows.iter().enumerate() {
            for ((_, g), t) in self.groups.iter_mut().zip(plan.forward.groups_of(index)) {
                let n = t.pages.len() as u64;
                g.row_pages += n;
                g.max_row_pages = g.max_row_pages.max(n);
                g.max_base_offset = g.max_base_offset.max(u64::from(t.base));
            }
            match row.kind {
                RowKind::Prefill => {
                    c.prefill_rows += 1;
                    c.prefill_tokens += u64::from(row.input_length);
                    if self.started.insert(row.request_id.clone()) {
                        c.first_chunks += 1;
                        c.hit_tokens += u64::from(row.extend_prefix_len);
                    } else {
                        c.later_chunks += 1;
                    }
                }
                RowKind::Decode | RowKind::Recovery => {
                    c.decode_rows += 1;
                    c.decode_tokens += u64::from(row.input_length);
                    if row.hist_token_len != -1 {
                        c.retract_recover_rows += 1;
                    }
                }
            }
        }
        c.device_hit_tokens = c.hit_tokens - c.host_hit_tokens.min(c.hit_tokens);
    }

    fn answer(
        &mut self,
        plan: &ExecutionPlan,
        finished: &mut Vec<RequestId>,
    ) -> Result<Vec<EngineEvent>, WorkloadError> {
        let mut events: Vec<EngineEvent> = canonical(&plan.write_backs)
            .into_iter()
            .map(|(op, _)| EngineEvent::WriteBackDone {
                op_id: op.op_id,
                success: true,
            })
            .collect();
        for row in &plan.forward.rows {
            if !engine_rule::yields_token(row) {
                continue;
            }
            let Some(turn) = self.turns.get_mut(&row.request_id) else {
                return Err(WorkloadError::UnknownRow(row.request_id.clone()));
            };
            let token = turn.stream[turn.produced];
            turn.produced += 1;
            let (generated, max_new) = (turn.produced, turn.stream.len());
            if engine_rule::push_token(&mut events, &row.request_id, token, generated, max_new) {
                finished.push(row.request_id.clone());
            }
        }
        Ok(events)
    }

    /// A turn ends (finished or dropped): the conversation's next turn is ready at
    /// `ready`.
    fn end_turn(&mut self, id: &RequestId, answered: bool, ready: u64) {
        let Some(turn) = self.turns.remove(id) else {
            return;
        };
        self.started.remove(id);
        let conv = &mut self.conversations[turn.conversation];
        if answered {
            conv.history.extend_from_slice(&turn.user);
            conv.history.extend_from_slice(&turn.stream);
            self.counters.finished += 1;
        } else {
            self.counters.aborted += 1;
        }
        conv.live = None;
        conv.next_turn += 1;
        conv.ready = ready;
    }

    fn device_free(&mut self) -> Result<u64, WorkloadError> {
        Ok(u64::from(
            self.system.stats()?.scheduler.available_device_pages,
        ))
    }
}

/// Safety net against a livelocked scheduler.
const STEP_LIMIT: u64 = 1_000_000;

/// Runs a hybrid workload to completion.
pub fn run_hybrid(options: &HybridOptions) -> Result<HybridReport, WorkloadError> {
    let variant = options.variant;
    let shape = variant.shape();
    let config = SchedulerConfig {
        policy: options.policy,
        ..variant.config(options.policy)
    };
    let system = scheduler_on(options.path, config.clone())?;
    let mut group_ids: Vec<String> = config
        .paged
        .iter()
        .flat_map(|p| p.groups.iter().map(|g| g.id.clone()))
        .collect();
    group_ids.sort_unstable();
    let groups = group_ids
        .iter()
        .map(|id| (id.clone(), GroupCounters::default()))
        .collect();
    let systems: Vec<Vec<Token>> = (0..shape.num_sys)
        .map(|k| gen_tokens(tag(shape.w, 1, k as u64), shape.sys_len))
        .collect();
    let conversations = (0..shape.conversations)
        .map(|c| Conversation {
            history: systems
                .get(c % shape.num_sys.max(1))
                .cloned()
                .unwrap_or_default(),
            next_turn: 0,
            ready: 0,
            live: None,
        })
        .collect();
    let mut run = Run {
        shape,
        system,
        conversations,
        turns: BTreeMap::new(),
        started: BTreeSet::new(),
        aborts_seen_next_step: Vec::new(),
        counters: HybridCounters {
            turns: (shape.conversations * shape.turns) as u64,
            min_device_free_pages: u64::MAX,
            ..HybridCounters::default()
        },
        digests: Digests::new(group_ids),
        groups,
        plans: options.record_plans.then(Vec::new),
        page_size: u64::from(config.page_size),
        measured_ns: 0,
    };
    let total = run.counters.turns;
    let mut step = 0u64;
    while run.counters.finished + run.counters.aborted < total {
        run.submit_ready(step)?;
        // Aborts announced by the last plan are gone from the scheduler after this one.
        let seen_now = std::mem::take(&mut run.aborts_seen_next_step);
        let (_, finished) = run.plan_and_answer()?;
        step += 1;
        run.counters.steps = step;
        let free = run.device_free()?;
        run.counters.min_device_free_pages = run.counters.min_device_free_pages.min(free);
        for id in finished {
            run.end_turn(&id, true, step);
        }
        for id in seen_now {
            run.end_turn(&id, false, step);
        }
        if step > STEP_LIMIT {
            return Err(WorkloadError::Stalled(step));
        }
    }
    loop {
        let (has_work, _) = run.plan_and_answer()?;
        run.counters.flush_plans += 1;
        if !has_work {
            break;
        }
        if run.counters.flush_plans > STEP_LIMIT {
            return Err(WorkloadError::Stalled(step));
        }
    }
    run.counters.device_free_pages_end = run.device_free()?;
    let paged = run.system.stats()?.scheduler.groups;
    if let Some(report) = &paged {
        for g in &report.groups {
            if let Some(c) = run.groups.get_mut(&g.id) {
                c.total_pages = u64::from(g.total_pages);
                c.free_end = u64::from(g.free_pages);
                c.failed_alloc = g.failed_alloc;
                // Usable pages nothing live holds at the end: snapshots'.
                c.held_end = u64::from(g.total_pages - 1 - g.free_pages);
            }
        }
    }
    let plans = run
        .plans
        .take()
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, line)| format!("{{\"step\": {i}, {line}}}"))
        .collect();
    let steps = run.counters.steps;
    Ok(HybridReport {
        workload: variant.name(),
        path: options.path.name(),
        policy: match options.policy {
            Policy::Default => "default",
            Policy::Reference => "reference",
            Policy::ReferenceWheel => "reference-wheel",
        },
        counters: run.counters,
        digest: format!("{:016x}", run.digests.decisions.0),
        digest_pages: format!("{:016x}", run.digests.pages.0),
        digest_all: (!run.groups.is_empty()).then(|| format!("{:016x}", run.digests.all.0)),
        paged: paged.map(|r| PagedCounters {
            snapshots_created: r.stats.snapshots_created,
            snapshots_adopted: r.stats.snapshots_adopted,
            terminal_continuations: r.stats.terminal_continuations,
            prune_state_only: r.stats.prune_state_only,
            prune_full: r.stats.prune_full,
            prune_cascade: r.stats.prune_cascade,
            dropped_kv_evict: r.stats.dropped_kv_evict,
            admission_denied: r.stats.admission_denied,
            stale_state_detached: r.stats.stale_state_detached,
            snapshots_end: r.snapshots as u64,
            tables_end: r.live_tables as u64,
        }),
        groups: run.groups,
        measured_ns: run.measured_ns,
        callgrind_divisor: steps.max(1),
        plans,
    })
}
