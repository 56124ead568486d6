//! The `kvtier` command.
//!
//! * `kvtier replay` — the main job: replays a scenario (`chat` by default) through the
//!   scheduler with the reference engine, which checks every KV slot it reads, and prints
//!   the report. Benchmark workloads replay through the core.
//! * `kvtier bench w1|w2|w3` — runs one benchmark workload exactly as defined in
//!   WORKLOADS.md; `--json` makes the last stdout line one JSON object.

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use kvtier_sim::l3_bench::{L3BenchOptions, run_l3_bench};
use kvtier_sim::reference::Verify;
use kvtier_sim::scenario::{
    CostModel, L3Store, Scenario, ScenarioOptions, ScenarioReport, run_scenario_with_progress,
};
use kvtier_sim::{Path, Report, WorkloadKind, WorkloadOptions, run_workload};

#[derive(Debug, Parser)]
#[command(
    name = "kvtier",
    version,
    about = "KV-cache scheduler: replay workloads and benchmark the core"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay a workload through the scheduler and print its report (the default).
    Replay(ReplayArgs),
    /// Run a benchmark workload (WORKLOADS.md) and print its counters and timings.
    Bench {
        /// Which workload.
        #[arg(value_enum)]
        workload: Workload,
        /// Tokens per page.
        #[arg(long, default_value_t = 64)]
        page_size: u32,
        /// W1 only: the -L2 variant (host tier on, write-back on finish).
        #[arg(long)]
        l2: bool,
        /// W1: requests per pass (multiple of 200); W2: number of requests N.
        #[arg(long)]
        requests: Option<usize>,
        /// W1 only: route only this pass (1 or 2) through the measured calls, so that
        /// callgrind counts one pass.
        #[arg(long)]
        measure_pass: Option<u8>,
        /// Diagnostic run: KV-cache events on, counted (not for timing).
        #[arg(long)]
        kv_events: bool,
        /// The path the workload drives: the core directly, or the actor system (actix,
        /// or the deterministic runtime).
        #[arg(long, value_enum, default_value_t = Path::Core)]
        runtime: Path,
        /// `bench l3` only: the store (`local` by default, or `mooncake`: the cluster the
        /// environment describes).
        #[arg(long, value_enum)]
        l3: Option<L3Choice>,
        /// Print one JSON object as the last line of stdout.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Clone, Default, clap::Args)]
struct ReplayArgs {
    /// Workload to replay: a scenario through the reference engine, or a benchmark
    /// workload through the core.
    #[arg(long, value_enum)]
    workload: Option<ReplayWorkload>,
    /// Turn the prefix cache and host tier off (every request computes its whole prompt).
    #[arg(long)]
    no_cache: bool,
    /// How much KV the integrity oracle checks.
    #[arg(long, value_enum)]
    verify: Option<VerifyMode>,
    /// Read the replay's settings from a TOML file (see docs/replay.example.toml);
    /// flags given explicitly override it.
    #[arg(long)]
    config: Option<std::path::PathBuf>,
    /// Write the report as JSON to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Run the actors on the deterministic runtime (same messages, fixed order).
    #[arg(long, conflicts_with = "runtime")]
    deterministic: bool,
    /// Which path runs the replay (default: the actix actor system).
    #[arg(long, value_enum)]
    runtime: Option<Path>,
    /// The L3 store (default: `local` for longdoc, `off` otherwise). `mooncake` needs a
    /// cluster in the environment (`cargo xtask mooncake up`, then
    /// `eval "$(cargo xtask mooncake env)"`).
    #[arg(long, value_enum)]
    l3: Option<L3Choice>,
    /// `--l3 local`: keep the store in this directory (default: a fresh temporary one,
    /// removed after the run). A second run over the same directory finds the documents
    /// of the first.
    #[arg(long)]
    l3_dir: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum L3Choice {
    Off,
    Local,
    Mooncake,
}

impl L3Choice {
    fn store(self) -> L3Store {
        match self {
            L3Choice::Off => L3Store::Off,
            L3Choice::Local => L3Store::Local,
            L3Choice::Mooncake => L3Store::Mooncake,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum ReplayWorkload {
    Chat,
    Rollout,
    Longdoc,
    W1,
    W2,
    W3,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
enum VerifyMode {
    Full,
    Sampled,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Workload {
    W1,
    W2,
    W3,
    /// Page-copy bandwidth of the kernel library against memcpy (bench only).
    Copy,
    /// Prefetch and backup throughput through the L3 actor against the raw store
    /// (bench only).
    L3,
}

impl Workload {
    /// The scheduler workload, or `None` for the copy and L3 benchmarks.
    fn kind(self) -> Option<WorkloadKind> {
        match self {
            Workload::W1 => Some(WorkloadKind::W1),
            Workload::W2 => Some(WorkloadKind::W2),
            Workload::W3 => Some(WorkloadKind::W3),
            Workload::Copy | Workload::L3 => None,
        }
    }
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli
        .command
        .unwrap_or(Command::Replay(ReplayArgs::default()))
    {
        Command::Replay(args) => replay(args)?,
        Command::Bench {
            workload,
            page_size,
            l2,
            requests,
            measure_pass,
            kv_events,
            runtime,
            l3,
            json,
        } => {
            if l3.is_some() && workload != Workload::L3 {
                bail!("--l3 applies to `bench l3`");
            }
            let Some(kind) = workload.kind() else {
                return match workload {
                    Workload::L3 => bench_l3(l3.unwrap_or(L3Choice::Local), json),
                    _ => bench_copy(json),
                };
            };
            if l2 && kind != WorkloadKind::W1 {
                bail!("--l2 applies to w1 only (w3 always has a host tier, w2 never)");
            }
            if kind == WorkloadKind::W3 && page_size != 64 {
                bail!("w3 is defined at --page-size 64 only");
            }
            let options = WorkloadOptions {
                kind,
                page_size,
                l2,
                requests,
                measure_pass,
                kv_events,
                path: runtime,
                record_plans: false,
            };
            if measure_pass.is_some() && kind != WorkloadKind::W1 {
                bail!("--measure-pass applies to w1 only");
            }
            let report = run_workload(&options).context("bench failed")?;
            print_table(&report);
            if json {
                println!("{}", serde_json::to_string(&report)?);
            }
        }
    }
    Ok(())
}

/// A replay config file (`--config`); every field is optional. See
/// docs/replay.example.toml.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayFile {
    workload: Option<ReplayWorkload>,
    cache: Option<bool>,
    publish: Option<bool>,
    verify: Option<VerifyMode>,
    fail_every_nth_write_back: Option<u64>,
    l3: Option<L3Choice>,
    l3_dir: Option<std::path::PathBuf>,
    cost: Option<CostFile>,
}

/// The virtual clock's cost model; unset fields keep their defaults.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CostFile {
    step_us: Option<f64>,
    prefill_us_per_token: Option<f64>,
    decode_us_per_row: Option<f64>,
    kv_bytes_per_token: Option<f64>,
    h2d_gbps: Option<f64>,
    l3_gbps: Option<f64>,
}

impl CostFile {
    fn apply(&self, mut cost: CostModel) -> Result<CostModel> {
        let fields = [
            ("step_us", self.step_us, &mut cost.step_us),
            (
                "prefill_us_per_token",
                self.prefill_us_per_token,
                &mut cost.prefill_us_per_token,
            ),
            (
                "decode_us_per_row",
                self.decode_us_per_row,
                &mut cost.decode_us_per_row,
            ),
            (
                "kv_bytes_per_token",
                self.kv_bytes_per_token,
                &mut cost.kv_bytes_per_token,
            ),
        ];
        for (name, value, slot) in fields {
            if let Some(v) = value {
                if !(v.is_finite() && v >= 0.0) {
                    bail!("cost.{name} must be a finite number ≥ 0, got {v}");
                }
                *slot = v;
            }
        }
        let bandwidths = [
            ("h2d_gbps", self.h2d_gbps, &mut cost.h2d_gbps),
            ("l3_gbps", self.l3_gbps, &mut cost.l3_gbps),
        ];
        for (name, value, slot) in bandwidths {
            if let Some(v) = value {
                if !(v.is_finite() && v > 0.0) {
                    bail!("cost.{name} must be a finite number > 0, got {v}");
                }
                *slot = v;
            }
        }
        Ok(cost)
    }
}

fn read_replay_file(path: &std::path::Path) -> Result<ReplayFile> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("invalid replay config {}", path.display()))
}

/// The path a replay drives: the actor system unless told otherwise.
fn replay_path(args: &ReplayArgs) -> Path {
    match (args.deterministic, args.runtime) {
        (true, _) => Path::Deterministic,
        (false, Some(runtime)) => runtime,
        (false, None) => Path::Actors,
    }
}

/// `kvtier replay`: the main job.
fn replay(args: ReplayArgs) -> Result<()> {
    let file = match &args.config {
        Some(path) => read_replay_file(path)?,
        None => ReplayFile::default(),
    };
    let workload = args
        .workload
        .or(file.workload)
        .unwrap_or(ReplayWorkload::Chat);
    let scenario = match workload {
        ReplayWorkload::Chat => Scenario::Chat,
        ReplayWorkload::Rollout => Scenario::Rollout,
        ReplayWorkload::Longdoc => Scenario::Longdoc,
        other => {
            if args.no_cache || args.l3.is_some() || args.l3_dir.is_some() {
                bail!(
                    "--no-cache, --l3 and --l3-dir apply to the chat, rollout and longdoc scenarios"
                );
            }
            let kind = match other {
                ReplayWorkload::W1 => WorkloadKind::W1,
                ReplayWorkload::W2 => WorkloadKind::W2,
                _ => WorkloadKind::W3,
            };
            let options = WorkloadOptions {
                path: replay_path(&args),
                ..WorkloadOptions::new(kind)
            };
            let report = run_workload(&options).context("replay failed")?;
            print_table(&report);
            return write_json(args.json.as_deref(), &report);
        }
    };
    let verify = match args.verify.or(file.verify).unwrap_or(VerifyMode::Full) {
        VerifyMode::Full => Verify::Full,
        VerifyMode::Sampled => Verify::Sampled(16),
        VerifyMode::Off => Verify::Off,
    };
    let cost = match &file.cost {
        Some(c) => c.apply(CostModel::default())?,
        None => CostModel::default(),
    };
    let options = ScenarioOptions {
        cache: !args.no_cache && file.cache.unwrap_or(true),
        publish: file.publish.unwrap_or(true),
        verify,
        fail_every_nth_write_back: file.fail_every_nth_write_back.unwrap_or(0),
        cost,
        path: replay_path(&args),
        ..ScenarioOptions::new(scenario)
    };
    let l3 = args.l3.or(file.l3).map_or(options.l3, L3Choice::store);
    let l3_dir = args.l3_dir.clone().or(file.l3_dir);
    if l3_dir.is_some() && l3 != L3Store::Local {
        bail!("--l3-dir applies to the local L3 store (--l3 local)");
    }
    let options = ScenarioOptions {
        l3,
        l3_dir,
        ..options
    };
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} requests")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(format!("replay {}", scenario.name()));
    let report = run_scenario_with_progress(&options, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })
    .context("replay failed")?;
    bar.finish_and_clear();
    print_scenario(&report);
    write_json(args.json.as_deref(), &report)?;
    if report.integrity_errors > 0 {
        bail!(
            "{} integrity errors; first: {:?}",
            report.integrity_errors,
            report.first_errors.first()
        );
    }
    Ok(())
}

fn write_json(path: Option<&std::path::Path>, report: &impl serde::Serialize) -> Result<()> {
    if let Some(path) = path {
        std::fs::write(path, serde_json::to_string_pretty(report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn print_scenario(r: &ScenarioReport) {
    let pct = |n: u64, d: u64| {
        if d == 0 {
            0.0
        } else {
            100.0 * n as f64 / d as f64
        }
    };
    println!(
        "replay {} (prefix cache and host tier {})",
        r.workload,
        if r.cache { "on" } else { "off" }
    );
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let rows: Vec<(&str, String)> = vec![
        (
            "requests",
            format!(
                "{} ({} finished, {} aborted)",
                r.requests, r.finished, r.aborted
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
            "  from device",
            format!(
                "{:.1} %",
                pct(r.hit_tokens - r.hit_tokens_host, r.prompt_tokens)
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
        ("L3 store", r.l3.clone()),
    ];
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
                "{} ops, {} pages, {:.1} MiB ({} failed, {} pages found at submit)",
                r.l3_prefetch_ops,
                r.l3_prefetched_pages,
                mib(r.l3_prefetched_bytes),
                r.l3_failed_prefetches,
                r.l3_lookup_hit_pages
            ),
        ),
        (
            "  backed up",
            format!(
                "{} ops, {} pages, {:.1} MiB",
                r.l3_backup_ops,
                r.l3_backed_up_pages,
                mib(r.l3_backed_up_bytes)
            ),
        ),
        ("  corrupt objects", r.l3_corrupt_objects.to_string()),
    ];
    let tail_rows: Vec<(&str, String)> = vec![
        ("retractions", r.retractions.to_string()),
        ("integrity errors", r.integrity_errors.to_string()),
        (
            "virtual time",
            format!("{:.2} s (cost model: docs/data-plane.md)", r.virtual_s),
        ),
        (
            "TTFT",
            format!(
                "{:.1} ms mean, {:.1} ms median",
                r.ttft_mean_ms, r.ttft_p50_ms
            ),
        ),
        ("time per token", format!("{:.1} ms", r.tpot_mean_ms)),
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
    let rows = rows
        .into_iter()
        .chain(l3_rows.into_iter().filter(|_| l3_on))
        .chain(tail_rows);
    for (name, value) in rows {
        println!("  {name:<20} {value}");
    }
}

/// `kvtier bench copy`: write-back bandwidth of the kernel library against plain memcpy
/// of the same bytes, for pages of 16 KiB to 1 MiB.
fn bench_copy(json: bool) -> Result<()> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    println!("page copy, device → host, {threads} threads (median of 7 runs)");
    println!(
        "  {:>10} {:>7} {:>12} {:>12} {:>7}",
        "page", "pages", "kernel GB/s", "memcpy GB/s", "ratio"
    );
    let mut out = serde_json::Map::new();
    out.insert("workload".into(), "copy".into());
    out.insert("threads".into(), threads.into());
    for kib in [16u32, 64, 256, 1024] {
        let r = kvtier_device::bench::measure_copy(kib, 7, threads)?;
        println!(
            "  {:>7} KiB {:>7} {:>12.2} {:>12.2} {:>6.0}%",
            kib,
            r.pages,
            r.kernel_gbps,
            r.memcpy_gbps,
            100.0 * r.ratio()
        );
        out.insert(format!("p{kib}k_kernel_gbps"), r.kernel_gbps.into());
        out.insert(format!("p{kib}k_memcpy_gbps"), r.memcpy_gbps.into());
        out.insert(format!("p{kib}k_ratio"), r.ratio().into());
    }
    if json {
        println!("{}", serde_json::Value::Object(out));
    }
    Ok(())
}

/// `kvtier bench l3`: prefetch and backup through the L3 actor against the raw store's
/// get and put of the same pages.
fn bench_l3(store: L3Choice, json: bool) -> Result<()> {
    if store == L3Choice::Off {
        bail!("bench l3 needs a store: --l3 local or --l3 mooncake");
    }
    let options = L3BenchOptions::new(store.store());
    println!(
        "L3 transfers, {} store, {} MiB batches (median of {} rounds)",
        store.store().name(),
        options.batch_bytes >> 20,
        options.rounds
    );
    let r = run_l3_bench(&options).context("bench l3 failed")?;
    println!(
        "  {:>8} {:>6} {:>9} {:>11} {:>6} {:>9} {:>13} {:>6}",
        "page", "pages", "put GB/s", "backup GB/s", "ratio", "get GB/s", "prefetch GB/s", "ratio"
    );
    for row in &r.rows {
        println!(
            "  {:>4} KiB {:>6} {:>9.2} {:>11.2} {:>5.0}% {:>9.2} {:>13.2} {:>5.0}%",
            row.page_kib,
            row.pages,
            row.raw_put_gbps,
            row.actor_backup_gbps,
            100.0 * row.backup_ratio,
            row.raw_get_gbps,
            row.actor_prefetch_gbps,
            100.0 * row.prefetch_ratio
        );
    }
    if json {
        // Flat, like every bench line (`cargo xtask bench` tabulates them).
        let mut out = serde_json::Map::new();
        out.insert("workload".into(), "l3".into());
        out.insert("store".into(), r.store.clone().into());
        out.insert("rounds".into(), r.rounds.into());
        for row in &r.rows {
            let k = row.page_kib;
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
        println!("{}", serde_json::Value::Object(out));
    }
    Ok(())
}

fn print_table(r: &Report) {
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
    for (name, value) in rows {
        println!("  {name:<22} {value}");
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_replay_config_parses() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/replay.example.toml"
        );
        let file = read_replay_file(std::path::Path::new(path)).expect("example parses");
        assert_eq!(file.workload, Some(ReplayWorkload::Rollout));
        let cost = file
            .cost
            .expect("cost section")
            .apply(CostModel::default())
            .expect("valid");
        assert_eq!(cost.h2d_gbps, 50.0);
    }

    #[test]
    fn bad_replay_configs_are_refused_clearly() {
        let unknown: Result<ReplayFile, _> = toml::from_str("worklaod = \"chat\"");
        assert!(
            unknown
                .unwrap_err()
                .to_string()
                .contains("unknown field `worklaod`")
        );
        let bad_enum: Result<ReplayFile, _> = toml::from_str("verify = \"most\"");
        assert!(bad_enum.is_err());
        let cost: ReplayFile = toml::from_str("[cost]\nh2d_gbps = 0").expect("parses");
        let err = cost
            .cost
            .expect("cost")
            .apply(CostModel::default())
            .unwrap_err();
        assert!(err.to_string().contains("h2d_gbps"), "{err}");
    }
}
