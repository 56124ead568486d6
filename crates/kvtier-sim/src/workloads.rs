//! The benchmark workloads W1–W3, exactly as WORKLOADS.md §2–§4 define them.

use std::collections::BTreeMap;

use kvtier_types::{RequestId, RequestSpec, SchedulerConfig, Token};
use serde::Serialize;

use crate::api::{Path, scheduler_on};
use crate::engine::{Counters, StepDriver};
pub use crate::engine::{Observe, WorkloadError};
use crate::tokens::{gen_tokens, tag};

/// Which workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum WorkloadKind {
    /// Prefix-cache ops: 200 system prompts × 50 suffixes, two passes.
    W1,
    /// Steady-state decode of N requests.
    W2,
    /// Multi-turn conversations under device pressure with a host tier.
    W3,
}

impl WorkloadKind {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::W1 => "w1",
            WorkloadKind::W2 => "w2",
            WorkloadKind::W3 => "w3",
        }
    }
}

/// Knobs of a run. Defaults give the reference definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadOptions {
    /// Which workload.
    pub kind: WorkloadKind,
    /// Tokens per page (W3 is defined at 64 only).
    pub page_size: u32,
    /// W1: the "-L2" variant (host pool, write-back on finish).
    pub l2: bool,
    /// W1: requests per pass (multiple of 200, default 10,000); W2: N (default 256).
    pub requests: Option<usize>,
    /// W1: route only this pass (1 or 2) through the measured functions, so callgrind
    /// counts one pass; `None` measures both.
    pub measure_pass: Option<u8>,
    /// Diagnostic run: KV-cache events on, counted (WORKLOADS.md §4).
    pub kv_events: bool,
    /// The path the workload drives: the core directly, or the actor system.
    pub path: Path,
    /// Record a digest of every plan in the report (for comparing paths).
    pub record_plans: bool,
    /// An embedder's observability, inside each timed step: the KV events published
    /// after every step (KV events on), the metrics refreshed every
    /// [`crate::scenario::METRICS_EVERY`] steps.
    pub observe: Observe,
}

impl WorkloadOptions {
    /// The reference definition of `kind`.
    pub fn new(kind: WorkloadKind) -> Self {
        Self {
            kind,
            page_size: 64,
            l2: false,
            requests: None,
            measure_pass: None,
            kv_events: false,
            path: Path::Core,
            record_plans: false,
            observe: Observe::default(),
        }
    }
}

/// The result of a run: counters, timings and per-phase figures. Flat, so one JSON line
/// holds it.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Workload name.
    pub workload: String,
    /// Tokens per page.
    pub page_size: u32,
    /// Whether the host tier was on.
    pub l2: bool,
    /// Requests submitted.
    pub requests: u64,
    /// Counters of the whole run.
    #[serde(flatten)]
    pub counters: Counters,
    /// Nanoseconds inside the measured calls.
    pub measured_ns: u64,
    /// W1: measured ns per request (both passes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ns_per_request: Option<f64>,
    /// W2: mean measured ns per steady step; W3: measured ns per step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ns_per_step: Option<f64>,
    /// W2: median measured ns per steady step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steady_p50_ns: Option<u64>,
    /// W2: steady steps measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steady_steps: Option<u64>,
    /// W2: steps with prefill rows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_steps: Option<u64>,
    /// W1: pass 1 steps, hit tokens, prefill rows, non-first chunks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass1_steps: Option<u64>,
    /// W1 pass 1 hit tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass1_hit_tokens: Option<u64>,
    /// W1 pass 1 host-tier hit tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass1_hit_tokens_host: Option<u64>,
    /// W1 pass 1 write-back ops / pages, load-back ops / pages.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass1_writeback_ops: Option<u64>,
    /// W1 pass 1 write-back pages.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass1_writeback_pages: Option<u64>,
    /// W1 pass 1 load-back ops.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass1_loadback_ops: Option<u64>,
    /// W1 pass 1 load-back pages.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass1_loadback_pages: Option<u64>,
    /// W1 pass 1 prefill rows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass1_prefill_rows: Option<u64>,
    /// W1 pass 1 non-first chunks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass1_non_first_chunks: Option<u64>,
    /// W1 pass 1 measured ns per request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass1_ns_per_request: Option<f64>,
    /// W1 pass 2 steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass2_steps: Option<u64>,
    /// W1 pass 2 hit tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass2_hit_tokens: Option<u64>,
    /// W1 pass 2 host-tier hit tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass2_hit_tokens_host: Option<u64>,
    /// W1 pass 2 write-back ops.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass2_writeback_ops: Option<u64>,
    /// W1 pass 2 load-back ops.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass2_loadback_ops: Option<u64>,
    /// W1 pass 2 load-back pages.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass2_loadback_pages: Option<u64>,
    /// W1 pass 2 measured ns per request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pass2_ns_per_request: Option<f64>,
    /// What callgrind totals should be divided by (requests for W1, steady steps for
    /// W2, steps for W3).
    pub callgrind_divisor: u64,
    /// The path the run drove (core, actors, deterministic).
    pub path: &'static str,
    /// A digest of every plan, in order (with `record_plans`).
    #[serde(skip)]
    pub plan_digests: Vec<u64>,
}

impl Report {
    fn new(options: &WorkloadOptions, driver: &StepDriver, requests: u64, divisor: u64) -> Self {
        Self {
            workload: options.kind.name().into(),
            path: options.path.name(),
            plan_digests: driver.plan_digests.clone().unwrap_or_default(),
            page_size: options.page_size,
            l2: options.l2 || options.kind == WorkloadKind::W3,
            requests,
            counters: driver.counters.clone(),
            measured_ns: driver.measured_ns,
            ns_per_request: None,
            ns_per_step: None,
            steady_p50_ns: None,
            steady_steps: None,
            prefill_steps: None,
            pass1_steps: None,
            pass1_hit_tokens: None,
            pass1_hit_tokens_host: None,
            pass1_writeback_ops: None,
            pass1_writeback_pages: None,
            pass1_loadback_ops: None,
            pass1_loadback_pages: None,
            pass1_prefill_rows: None,
            pass1_non_first_chunks: None,
            pass1_ns_per_request: None,
            pass2_steps: None,
            pass2_hit_tokens: None,
            pass2_hit_tokens_host: None,
            pass2_writeback_ops: None,
            pass2_loadback_ops: None,
            pass2_loadback_pages: None,
            pass2_ns_per_request: None,
            callgrind_divisor: divisor.max(1),
        }
    }
}

/// Runs a workload to completion.
pub fn run_workload(options: &WorkloadOptions) -> Result<Report, WorkloadError> {
    if options.page_size == 0 {
        return Err(WorkloadError::Options("page size must be positive".into()));
    }
    match options.kind {
        WorkloadKind::W1 => run_w1(options),
        WorkloadKind::W2 => run_w2(options),
        WorkloadKind::W3 => run_w3(options),
    }
}

fn new_driver(o: &WorkloadOptions, config: SchedulerConfig) -> Result<StepDriver, WorkloadError> {
    let watched = o.observe.is_on();
    let config = SchedulerConfig {
        enable_kv_cache_events: config.enable_kv_cache_events || o.observe.kv_events.is_some(),
        track_lost_hits: config.track_lost_hits || watched,
        ..config
    };
    let mut driver = StepDriver::new(scheduler_on(o.path, config.clone())?, &config);
    driver.observe = o.observe.clone();
    if o.record_plans {
        driver.plan_digests = Some(Vec::new());
    }
    Ok(driver)
}

fn base_config(o: &WorkloadOptions) -> SchedulerConfig {
    SchedulerConfig {
        page_size: o.page_size,
        enable_kv_cache_events: o.kv_events,
        decode_input_tokens: 1,
        enable_l3_storage: false,
        max_scheduled_tokens: 8192,
        ..SchedulerConfig::default()
    }
}

/// Safety net against a livelocked scheduler: no workload needs this many steps.
const STEP_LIMIT: u64 = 10_000_000;

fn run_w1(o: &WorkloadOptions) -> Result<Report, WorkloadError> {
    const SYSTEMS: usize = 200;
    let per_pass = o.requests.unwrap_or(10_000);
    if per_pass == 0 || !per_pass.is_multiple_of(SYSTEMS) || per_pass > 10_000 {
        return Err(WorkloadError::Options(
            "W1 requests must be a multiple of 200, at most 10000".into(),
        ));
    }
    let waves = per_pass / SYSTEMS;
    let ps = o.page_size as usize;
    let unique_pages = SYSTEMS * 1024 / ps + per_pass * 512 / ps;
    let total = (unique_pages + 8192 + 1) as u32;
    let config = SchedulerConfig {
        device_pages: total,
        host_pages: if o.l2 { total } else { 0 },
        disable_l2_cache: !o.l2,
        max_batch_size: 256,
        ..base_config(o)
    };
    let mut driver = new_driver(o, config)?;
    let systems: Vec<Vec<Token>> = (0..SYSTEMS)
        .map(|i| gen_tokens(tag(1, 1, i as u64), 1024))
        .collect();
    let mut pass_marks = Vec::new();
    if matches!(o.measure_pass, Some(p) if p != 1 && p != 2) {
        return Err(WorkloadError::Options("W1 has passes 1 and 2".into()));
    }
    for (pass, prefix) in [(1u8, "a"), (2, "b")] {
        driver.measure = o.measure_pass.is_none_or(|p| p == pass);
        let before = (driver.counters.clone(), driver.measured_ns);
        for wave in 0..waves {
            let batch: Vec<(RequestSpec, Vec<Token>)> = (0..SYSTEMS)
                .map(|i| {
                    let k = wave * SYSTEMS + i;
                    let mut prompt = systems[i].clone();
                    prompt.extend(gen_tokens(tag(1, 2, (i * 50 + wave) as u64), 512));
                    let id = RequestId::from(format!("{prefix}{k:05}"));
                    (
                        RequestSpec::new(id, prompt),
                        gen_tokens(tag(1, 3, k as u64), 1),
                    )
                })
                .collect();
            driver.submit(batch)?;
            while driver.live() > 0 {
                driver.step()?;
                check_progress(&driver)?;
            }
        }
        while !driver.step()?.empty {
            check_progress(&driver)?;
        }
        pass_marks.push((before, (driver.counters.clone(), driver.measured_ns)));
    }
    let requests = 2 * per_pass as u64;
    let measured = if o.measure_pass.is_some() {
        per_pass as u64
    } else {
        requests
    };
    let mut report = Report::new(o, &driver, requests, measured);
    report.ns_per_request = Some(driver.measured_ns as f64 / requests as f64);
    let pass = |i: usize| -> (Counters, f64) {
        let ((c0, ns0), (c1, ns1)) = &pass_marks[i];
        let d = Counters {
            steps: c1.steps - c0.steps,
            hit_tokens: c1.hit_tokens - c0.hit_tokens,
            hit_tokens_host: c1.hit_tokens_host - c0.hit_tokens_host,
            prefill_rows: c1.prefill_rows - c0.prefill_rows,
            non_first_chunks: c1.non_first_chunks - c0.non_first_chunks,
            writeback_ops: c1.writeback_ops - c0.writeback_ops,
            writeback_pages: c1.writeback_pages - c0.writeback_pages,
            loadback_ops: c1.loadback_ops - c0.loadback_ops,
            loadback_pages: c1.loadback_pages - c0.loadback_pages,
            ..Counters::default()
        };
        (d, (ns1 - ns0) as f64 / per_pass as f64)
    };
    let (p1, ns1) = pass(0);
    let (p2, ns2) = pass(1);
    report.pass1_steps = Some(p1.steps);
    report.pass1_hit_tokens = Some(p1.hit_tokens);
    report.pass1_hit_tokens_host = Some(p1.hit_tokens_host);
    report.pass1_writeback_ops = Some(p1.writeback_ops);
    report.pass1_writeback_pages = Some(p1.writeback_pages);
    report.pass1_loadback_ops = Some(p1.loadback_ops);
    report.pass1_loadback_pages = Some(p1.loadback_pages);
    report.pass1_prefill_rows = Some(p1.prefill_rows);
    report.pass1_non_first_chunks = Some(p1.non_first_chunks);
    report.pass1_ns_per_request = Some(ns1);
    report.pass2_steps = Some(p2.steps);
    report.pass2_hit_tokens = Some(p2.hit_tokens);
    report.pass2_hit_tokens_host = Some(p2.hit_tokens_host);
    report.pass2_writeback_ops = Some(p2.writeback_ops);
    report.pass2_loadback_ops = Some(p2.loadback_ops);
    report.pass2_loadback_pages = Some(p2.loadback_pages);
    report.pass2_ns_per_request = Some(ns2);
    Ok(report)
}

fn check_progress(driver: &StepDriver) -> Result<(), WorkloadError> {
    if driver.counters.steps > STEP_LIMIT {
        return Err(WorkloadError::Stalled(driver.counters.steps));
    }
    Ok(())
}

fn run_w2(o: &WorkloadOptions) -> Result<Report, WorkloadError> {
    let n = o.requests.unwrap_or(256);
    if n == 0 {
        return Err(WorkloadError::Options(
            "W2 needs at least one request".into(),
        ));
    }
    let ps = o.page_size as usize;
    let total = (n * (2560usize.div_ceil(ps) + 2) + 1) as u32;
    let config = SchedulerConfig {
        device_pages: total,
        host_pages: 0,
        disable_l2_cache: true,
        max_batch_size: n as u32,
        ..base_config(o)
    };
    let mut driver = new_driver(o, config)?;
    let batch = (0..n)
        .map(|r| {
            let id = RequestId::from(format!("r{r:05}"));
            let prompt = gen_tokens(tag(2, 1, r as u64), 2048);
            (
                RequestSpec::new(id, prompt),
                gen_tokens(tag(2, 2, r as u64), 512),
            )
        })
        .collect();
    driver.submit(batch)?;
    let (mut prefill_steps, mut decode_step) = (0u64, 0u64);
    let mut steady = Vec::new();
    loop {
        // Only steady steps (decode steps 2..=510) go through the measured functions.
        driver.measure = decode_step >= 1 && (2..=510).contains(&(decode_step + 1));
        let out = driver.step()?;
        check_progress(&driver)?;
        if out.empty {
            break;
        }
        if out.had_prefill {
            prefill_steps += 1;
        } else {
            decode_step += 1;
            if (2..=510).contains(&decode_step) {
                steady.push(out.ns);
            }
        }
    }
    let steady_steps = steady.len() as u64;
    let mut report = Report::new(o, &driver, n as u64, steady_steps);
    report.prefill_steps = Some(prefill_steps);
    report.steady_steps = Some(steady_steps);
    if !steady.is_empty() {
        report.ns_per_step = Some(steady.iter().sum::<u64>() as f64 / steady.len() as f64);
        steady.sort_unstable();
        report.steady_p50_ns = Some(steady[steady.len() / 2]);
    }
    Ok(report)
}

fn run_w3(o: &WorkloadOptions) -> Result<Report, WorkloadError> {
    const CONVERSATIONS: usize = 64;
    const TURNS: usize = 8;
    let config = SchedulerConfig {
        device_pages: 769,
        host_pages: 3073,
        disable_l2_cache: false,
        max_batch_size: 64,
        ..base_config(o)
    };
    let mut driver = new_driver(o, config)?;
    driver.skip_empty_advance = true;
    struct Conversation {
        history: Vec<Token>,
        turn: usize,
        live: bool,
        ready: u64,
    }
    let mut convs: Vec<Conversation> = (0..CONVERSATIONS)
        .map(|_| Conversation {
            history: Vec::new(),
            turn: 0,
            live: false,
            ready: 0,
        })
        .collect();
    let mut owner: BTreeMap<RequestId, (usize, Vec<Token>, Vec<Token>)> = BTreeMap::new();
    let mut done = 0;
    let mut step = 0u64;
    while done < CONVERSATIONS * TURNS {
        let mut batch = Vec::new();
        for (c, conv) in convs.iter_mut().enumerate() {
            if conv.live || conv.turn >= TURNS || conv.ready > step {
                continue;
            }
            let i = (c * TURNS + conv.turn) as u64;
            let user = gen_tokens(tag(3, 1, i), 256);
            let stream = gen_tokens(tag(3, 2, i), 128);
            let id = RequestId::from(format!("c{c:03}t{}", conv.turn + 1));
            let mut prompt = conv.history.clone();
            prompt.extend_from_slice(&user);
            owner.insert(id.clone(), (c, user, stream.clone()));
            batch.push((RequestSpec::new(id, prompt), stream));
            conv.live = true;
        }
        if !batch.is_empty() {
            driver.submit(batch)?;
        }
        let out = driver.step()?;
        check_progress(&driver)?;
        for (id, answered) in out
            .finished
            .iter()
            .map(|id| (id, true))
            .chain(out.aborted.iter().map(|id| (id, false)))
        {
            let Some((c, user, stream)) = owner.remove(id) else {
                continue;
            };
            let conv = &mut convs[c];
            conv.history.extend_from_slice(&user);
            if answered {
                conv.history.extend_from_slice(&stream);
            }
            conv.live = false;
            conv.turn += 1;
            conv.ready = step + 1;
            done += 1;
        }
        step += 1;
    }
    let steps = driver.counters.steps;
    // Plans go on until one is empty: they carry the last write-backs (timed, not steps).
    while !driver.step()?.empty {
        check_progress(&driver)?;
    }
    driver.counters.steps = steps;
    let requests = (CONVERSATIONS * TURNS) as u64;
    let mut report = Report::new(o, &driver, requests, steps);
    report.ns_per_step = Some(driver.measured_ns as f64 / steps as f64);
    Ok(report)
}
