//! What the commands print and write: the text tables and the JSON of their results.

use anyhow::{Context, Result};
use kvtier_device::bench::CopyBench;
use kvtier_sim::Report;
use kvtier_sim::campaign::CampaignReport;
use kvtier_sim::l3_bench::{L3BenchOptions, L3BenchReport};
use kvtier_sim::scenario::ScenarioReport;

/// Writes `report` as pretty JSON to `path`, if one is given.
pub fn write_json(path: Option<&std::path::Path>, report: &impl serde::Serialize) -> Result<()> {
    if let Some(path) = path {
        std::fs::write(path, serde_json::to_string_pretty(report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// `n` as a percentage of `d` (0 when `d` is).
pub fn pct(n: u64, d: u64) -> f64 {
    if d == 0 {
        0.0
    } else {
        100.0 * n as f64 / d as f64
    }
}

/// The report of a cluster replay.
pub fn cluster(r: &kvtier_sim::cluster::ClusterReport) {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    println!(
        "replay {} on {} instances: {} routing, L3 {}",
        r.workload, r.instances, r.router.policy, r.l3
    );
    println!(
        "  requests            {} ({} finished, {} aborted, {} refused)",
        r.requests, r.finished, r.aborted, r.refused
    );
    println!(
        "  hit tokens          {} = {:.1}% of prompts, {:.1}% of the ideal bound ({}); from host {}, from L3 {}",
        r.hit_tokens,
        pct(r.hit_tokens, r.prompt_tokens),
        100.0 * r.hit_ratio_of_ideal,
        r.unbounded_hit_tokens,
        r.hit_tokens_host,
        r.hit_tokens_l3
    );
    println!(
        "  TTFT                mean {:.1} ms, p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms ({:.1} s virtual)",
        r.ttft_mean_ms, r.ttft_p50_ms, r.ttft_p90_ms, r.ttft_p99_ms, r.virtual_s
    );
    let per = |v: &[u64]| {
        v.iter()
            .map(|&b| format!("{:.2}", gib(b)))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    println!("  L3 read, GiB        {}", per(&r.l3_prefetched_bytes));
    println!("  L3 written, GiB     {}", per(&r.l3_backed_up_bytes));
    if r.l3_failed_prefetches + r.l3_lookup_errors > 0 {
        println!(
            "  L3 failures         {} prefetches, {} lookups (served as misses)",
            r.l3_failed_prefetches, r.l3_lookup_errors
        );
    }
    let q = &r.router;
    println!(
        "  routed              {}",
        q.routed
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" / ")
    );
    println!(
        "  router view         {} requests reused less than it showed, {} more; {} batches, {} events, {} replays",
        q.overestimated, q.underestimated, q.batches, q.events, q.replays
    );
    println!(
        "  router index        {} blocks at the end, {} at most ({:.1} MiB); {:.1} µs per request",
        q.index_blocks,
        q.index_peak_blocks,
        q.index_peak_bytes as f64 / (1 << 20) as f64,
        q.route_ns as f64 / 1e3 / r.requests.max(1) as f64
    );
    println!("  integrity errors    {}", r.integrity_errors);
}

/// The report of a scenario replay.
pub fn scenario(r: &ScenarioReport) {
    println!(
        "replay {} ({} model, prefix cache and host tier {})",
        r.workload,
        r.model,
        if r.cache { "on" } else { "off" }
    );
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let rows: Vec<(&str, String)> = vec![
        (
            "requests",
            format!(
                "{} ({} finished, {} aborted, {} refused{})",
                r.requests,
                r.finished,
                r.aborted,
                r.refused,
                if r.abort_reasons.is_empty() {
                    String::new()
                } else {
                    let reasons: Vec<String> = r
                        .abort_reasons
                        .iter()
                        .map(|(why, n)| format!("{n} {why}"))
                        .collect();
                    format!(": {}", reasons.join(", "))
                }
            ),
        ),
        ("prompt tokens", r.prompt_tokens.to_string()),
        ("generated tokens", r.generated_tokens.to_string()),
        (
            "hit ratio",
            format!(
                "{:.1} % ({} of {} ideal)",
                pct(r.hit_tokens, r.prompt_tokens),
                r.hit_tokens,
                r.ideal_hit_tokens
            ),
        ),
        (
            "  unbounded cache",
            format!(
                "{:.1} % ({} tokens: every earlier prompt cached, whatever the timing)",
                pct(r.unbounded_hit_tokens, r.prompt_tokens),
                r.unbounded_hit_tokens
            ),
        ),
        ("  lost hits", {
            let [not_reused, l3, prefetched, evicted] = r.lost_hit_tokens;
            format!(
                "{evicted} tokens evicted, {l3} in L3 and not prefetched, {prefetched} \
                     prefetched and evicted before use, {not_reused} held but not reused"
            )
        }),
        (
            "  from device",
            format!(
                "{:.1} %",
                pct(
                    r.hit_tokens.saturating_sub(r.hit_tokens_host),
                    r.prompt_tokens
                )
            ),
        ),
        (
            "  from host",
            format!("{:.1} %", pct(r.hit_tokens_host, r.prompt_tokens)),
        ),
        (
            "write-backs",
            format!("{} ops, {} pages", r.writeback_ops, r.writeback_pages),
        ),
        (
            "load-backs",
            format!("{} ops, {} pages", r.loadback_ops, r.loadback_pages),
        ),
        ("bytes moved", format!("{:.1} MiB", mib(r.moved_bytes))),
        (
            "evictions",
            format!(
                "{} device pages, {} host pages",
                r.evicted_device_pages, r.evicted_host_pages
            ),
        ),
        ("L3 store", r.l3.clone()),
    ];
    // A hybrid model's recurrent states travel beside its pages.
    let states = |n: u64| {
        if !r.hybrid {
            String::new()
        } else {
            format!(", {n} states")
        }
    };
    let l3_rows: Vec<(&str, String)> = vec![
        (
            "  from L3",
            format!(
                "{:.1} % (part of the host hits)",
                pct(r.hit_tokens_l3, r.prompt_tokens)
            ),
        ),
        (
            "  prefetched",
            format!(
                "{} ops, {} pages{}, {:.1} MiB ({} failed, {} pages found at submit)",
                r.l3_prefetch_ops,
                r.l3_prefetched_pages,
                states(r.l3_prefetched_states),
                mib(r.l3_prefetched_bytes),
                r.l3_failed_prefetches,
                r.l3_lookup_hit_pages
            ),
        ),
        (
            "  backed up",
            format!(
                "{} ops, {} pages{}, {:.1} MiB",
                r.l3_backup_ops,
                r.l3_backed_up_pages,
                states(r.l3_backed_up_states),
                mib(r.l3_backed_up_bytes)
            ),
        ),
        ("  corrupt objects", r.l3_corrupt_objects.to_string()),
    ];
    let tail_rows: Vec<(&str, String)> = vec![
        ("retractions", r.retractions.to_string()),
        ("integrity errors", r.integrity_errors.to_string()),
        ("output digest", r.output_digest.clone()),
        (
            "virtual time",
            format!("{:.2} s (cost model: docs/data-plane.md)", r.virtual_s),
        ),
        (
            "TTFT",
            format!(
                "{:.1} ms mean, {:.1} / {:.1} / {:.1} ms p50 / p90 / p99",
                r.ttft_mean_ms, r.ttft_p50_ms, r.ttft_p90_ms, r.ttft_p99_ms
            ),
        ),
        (
            "time per token",
            format!(
                "{:.1} ms mean, {:.1} / {:.1} ms p50 / p99",
                r.tpot_mean_ms, r.tpot_p50_ms, r.tpot_p99_ms
            ),
        ),
        (
            "throughput",
            format!("{:.0} tokens/s", r.throughput_tokens_per_s),
        ),
        ("steps", r.steps.to_string()),
        (
            "scheduler time",
            format!(
                "{:.1} µs per step",
                r.scheduler_ns as f64 / 1e3 / r.steps.max(1) as f64
            ),
        ),
    ];
    let l3_on = r.l3 != "off";
    let traced = r.unbounded_hit_tokens > 0;
    let rows = rows
        .into_iter()
        .filter(|(name, _)| traced || *name != "  unbounded cache")
        .filter(|(name, _)| r.lost_hits_tracked || *name != "  lost hits")
        .chain(l3_rows.into_iter().filter(|_| l3_on))
        .chain(tail_rows);
    print_rows(rows, 20);
}

/// Prints a hybrid workload's counters and digests.
pub fn hybrid(r: &kvtier_sim::hybrid::HybridReport) {
    let c = &r.counters;
    println!("workload {} (path {})", r.workload, r.path);
    let rows: Vec<(&str, String)> = vec![
        (
            "steps",
            format!("{} (+{} flush plans)", c.steps, c.flush_plans),
        ),
        (
            "finished / aborted",
            format!("{} / {}", c.finished, c.aborted),
        ),
        (
            "rows",
            format!(
                "{} prefill ({} later chunks), {} decode ({} recovery)",
                c.prefill_rows, c.later_chunks, c.decode_rows, c.retract_recover_rows
            ),
        ),
        ("prompt tokens", c.prompt_tokens.to_string()),
        (
            "hit tokens",
            format!(
                "{} ({} device, {} host)",
                c.hit_tokens, c.device_hit_tokens, c.host_hit_tokens
            ),
        ),
        (
            "write-backs",
            format!(
                "{} ops, {} KV pages, {} states ({} on retract)",
                c.writeback_ops, c.writeback_kv_pages, c.writeback_mamba, c.retract_writeback_ops
            ),
        ),
        (
            "load-backs",
            format!(
                "{} ops, {} KV pages, {} states",
                c.loadback_ops, c.loadback_kv_pages, c.loadback_mamba
            ),
        ),
        ("min free device pages", c.min_device_free_pages.to_string()),
        ("decision digest", r.digest.clone()),
        ("page digest", r.digest_pages.clone()),
        (
            "scheduler time",
            format!(
                "{:.3} ms ({:.2} µs per step)",
                r.measured_ns as f64 / 1e6,
                r.measured_ns as f64 / 1e3 / c.steps.max(1) as f64
            ),
        ),
    ];
    print_rows(rows, 22);
}

/// The counters and timings of a benchmark workload.
pub fn workload(r: &Report) {
    let c = &r.counters;
    let ratio = |n: u64| {
        if c.prompt_tokens == 0 {
            0.0
        } else {
            n as f64 / c.prompt_tokens as f64
        }
    };
    println!(
        "workload {} (page size {}, host tier {})",
        r.workload,
        r.page_size,
        if r.l2 { "on" } else { "off" }
    );
    let rows: Vec<(&str, String)> = vec![
        ("requests", r.requests.to_string()),
        ("finished", c.finished.to_string()),
        ("steps", c.steps.to_string()),
        ("prompt tokens", c.prompt_tokens.to_string()),
        (
            "hit tokens",
            format!("{} ({:.4})", c.hit_tokens, ratio(c.hit_tokens)),
        ),
        ("  from device", c.hit_tokens_device.to_string()),
        ("  from host", c.hit_tokens_host.to_string()),
        (
            "prefill rows",
            format!(
                "{} ({} non-first chunks)",
                c.prefill_rows, c.non_first_chunks
            ),
        ),
        (
            "write-backs",
            format!("{} ops, {} pages", c.writeback_ops, c.writeback_pages),
        ),
        (
            "  on finish",
            format!(
                "{} ops, {} pages",
                c.finish_writeback_ops, c.finish_writeback_pages
            ),
        ),
        (
            "  on retract",
            format!(
                "{} ops, {} pages",
                c.retract_writeback_ops, c.retract_writeback_pages
            ),
        ),
        (
            "load-backs",
            format!("{} ops, {} pages", c.loadback_ops, c.loadback_pages),
        ),
        ("retractions", c.retractions.to_string()),
        ("aborts", c.aborts.to_string()),
        ("starved decode slots", c.starved_decode_slots.to_string()),
        (
            "KV events",
            format!(
                "{} stored, {} removed",
                c.kv_blocks_stored, c.kv_blocks_removed
            ),
        ),
        (
            "scheduler time",
            format!("{:.3} ms", r.measured_ns as f64 / 1e6),
        ),
    ];
    print_rows(rows, 22);
    if let Some(ns) = r.ns_per_request {
        println!("  {:<22} {:.2} µs", "per request", ns / 1e3);
    }
    if let Some(ns) = r.ns_per_step {
        println!("  {:<22} {:.2} µs", "per step", ns / 1e3);
    }
    if let (Some(p1), Some(p2)) = (r.pass1_hit_tokens, r.pass2_hit_tokens) {
        println!(
            "  {:<22} pass 1: {} steps, {} hit tokens; pass 2: {} steps, {} hit tokens",
            "passes",
            r.pass1_steps.unwrap_or(0),
            p1,
            r.pass2_steps.unwrap_or(0),
            p2
        );
    }
}

/// `bench copy`'s title and column header.
pub fn copy_header(threads: u32) {
    println!("page copy, device → host, {threads} threads (median of 7 runs)");
    println!(
        "  {:>10} {:>7} {:>12} {:>12} {:>7}",
        "page", "pages", "kernel GB/s", "memcpy GB/s", "ratio"
    );
}

/// `bench copy`'s row for pages of `kib` KiB.
pub fn copy_row(kib: u32, r: &CopyBench) {
    println!(
        "  {:>7} KiB {:>7} {:>12.2} {:>12.2} {:>6.0}%",
        kib,
        r.pages,
        r.kernel_gbps,
        r.memcpy_gbps,
        100.0 * r.ratio()
    );
}

/// `bench copy` as one flat JSON object.
pub fn copy_json(threads: u32, rows: &[(u32, CopyBench)]) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    out.insert("workload".into(), "copy".into());
    out.insert("threads".into(), threads.into());
    for (kib, r) in rows {
        out.insert(format!("p{kib}k_kernel_gbps"), r.kernel_gbps.into());
        out.insert(format!("p{kib}k_memcpy_gbps"), r.memcpy_gbps.into());
        out.insert(format!("p{kib}k_ratio"), r.ratio().into());
    }
    serde_json::Value::Object(out)
}

/// `bench l3`'s title, printed before the run.
pub fn l3_header(options: &L3BenchOptions) {
    println!(
        "L3 transfers, {} store, {} MiB batches (median of {} rounds)",
        options.store.name(),
        options.batch_bytes >> 20,
        options.rounds
    );
}

/// `bench l3`'s table: the plain file's write, the raw put (and its share of the plain
/// write), the backup through the actor (and its share of the put); the same for reads.
pub fn l3_table(r: &L3BenchReport) {
    println!(
        "  {:>8} {:>6} {:>6} {:>6} {:>5} {:>7} {:>5} {:>6} {:>6} {:>5} {:>8} {:>5}",
        "page",
        "pages",
        "plain",
        "put",
        "of it",
        "backup",
        "ratio",
        "plain",
        "get",
        "of it",
        "prefetch",
        "ratio"
    );
    println!(
        "  {:>8} {:>6} {:>6} {:>6} {:>5} {:>7} {:>5} {:>6} {:>6} {:>5} {:>8} {:>5}",
        "", "", "write", "GB/s", "", "GB/s", "", "read", "GB/s", "", "GB/s", ""
    );
    let share = |x: f64| {
        if x > 0.0 {
            format!("{:.0}%", 100.0 * x)
        } else {
            "-".to_string()
        }
    };
    for row in &r.rows {
        println!(
            "  {:>4} KiB {:>6} {:>6.2} {:>6.2} {:>5} {:>7.2} {:>5} {:>6.2} {:>6.2} {:>5} {:>8.2} {:>5}",
            row.page_kib,
            row.pages,
            row.plain_write_gbps,
            row.raw_put_gbps,
            share(row.put_vs_plain),
            row.actor_backup_gbps,
            share(row.backup_ratio),
            row.plain_read_gbps,
            row.raw_get_gbps,
            share(row.get_vs_plain),
            row.actor_prefetch_gbps,
            share(row.prefetch_ratio)
        );
    }
}

/// `bench l3` as one flat JSON object, like every bench line (`cargo xtask bench`
/// tabulates them).
pub fn l3_json(r: &L3BenchReport) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    out.insert("workload".into(), "l3".into());
    out.insert("store".into(), r.store.clone().into());
    out.insert("rounds".into(), r.rounds.into());
    for row in &r.rows {
        let k = row.page_kib;
        out.insert(
            format!("p{k}k_plain_write_gbps"),
            row.plain_write_gbps.into(),
        );
        out.insert(format!("p{k}k_put_vs_plain"), row.put_vs_plain.into());
        out.insert(format!("p{k}k_plain_read_gbps"), row.plain_read_gbps.into());
        out.insert(format!("p{k}k_get_vs_plain"), row.get_vs_plain.into());
        out.insert(format!("p{k}k_put_gbps"), row.raw_put_gbps.into());
        out.insert(format!("p{k}k_backup_gbps"), row.actor_backup_gbps.into());
        out.insert(format!("p{k}k_backup_ratio"), row.backup_ratio.into());
        out.insert(format!("p{k}k_get_gbps"), row.raw_get_gbps.into());
        out.insert(
            format!("p{k}k_prefetch_gbps"),
            row.actor_prefetch_gbps.into(),
        );
        out.insert(format!("p{k}k_prefetch_ratio"), row.prefetch_ratio.into());
    }
    serde_json::Value::Object(out)
}

/// The campaign's coverage table, then each failure with its shrunk reproduction.
pub fn campaign(r: &CampaignReport, jobs: usize, wall_s: f64) {
    let last = r.from.saturating_add(r.seeds.saturating_sub(1));
    println!(
        "campaign: seeds {}..={last}: {} passed, {} failed, {} could not run ({wall_s:.1} s on \
         {jobs} threads)",
        r.from,
        r.passed,
        r.failures.len(),
        r.errors.len()
    );
    println!(
        "\n  {:<40} {:>8} {:>7} {:>10}",
        "reached", "runs", "%", "total"
    );
    for row in &r.coverage {
        let pct = if r.passed == 0 {
            0.0
        } else {
            100.0 * row.runs as f64 / r.passed as f64
        };
        println!(
            "  {:<40} {:>8} {:>6.1}% {:>10}",
            row.metric, row.runs, pct, row.total
        );
    }
    for f in &r.failures {
        println!("\nseed {} FAILED: {}", f.seed, f.failure);
        println!(
            "  shrunk in {} runs to a spec that fails: {}",
            f.shrink_runs, f.shrunk_failure
        );
        println!("  reproduce: kvtier campaign --from {} --seeds 1", f.seed);
        for line in f.shrunk_spec.lines() {
            println!("  {line}");
        }
    }
    for e in &r.errors {
        println!("\nseed {} could not run: {}", e.seed, e.error);
    }
}

/// The campaign as one JSON object (the last line of stdout with `--json`).
pub fn campaign_json(r: &CampaignReport, jobs: usize, wall_s: f64) -> Result<String> {
    let mut value = serde_json::to_value(r)?;
    if let Some(object) = value.as_object_mut() {
        object.insert("jobs".into(), jobs.into());
        object.insert("wall_s".into(), wall_s.into());
    }
    Ok(serde_json::to_string(&value)?)
}

/// Prints `name value` rows, the names padded to `width`.
fn print_rows<'a>(rows: impl IntoIterator<Item = (&'a str, String)>, width: usize) {
    for (name, value) in rows {
        println!("  {name:<width$} {value}");
    }
}
