//! The hybrid benchmark workloads H1, H2 and H3, exactly as `design/HYBRID-WORKLOADS.md`
//! defines them: the conversation model, the step loop with its abort rule, the engine
//! rules, the plan-observable counters and the three FNV-1a digests (§2), so a run can be
//! compared with the reference scheduler counter for counter and plan for plan.

mod digests;
mod report;
mod run;

pub use report::{GroupCounters, HybridCounters, HybridReport, PagedCounters};
use std::collections::{BTreeMap, BTreeSet};

use digests::Digests;
use kvtier_model::ModelSpec;
use kvtier_paged::PoolBudget;
use kvtier_types::{GroupRole, MambaSettings, PagedSettings, Policy, SchedulerConfig, Token};
use run::{Conversation, Run};

use crate::api::{Path, scheduler_on};
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
