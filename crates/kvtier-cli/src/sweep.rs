//! `kvtier sweep`: a trace over a grid of capacities (docs/traces.md).

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use kvtier_sim::scenario::L3Store;
use kvtier_sim::sweep::{SweepOptions, run_sweep};
use kvtier_sim::trace::TraceSlice;

use crate::SweepArgs;
use crate::replay::load_trace;

/// Runs the grid, prints its table, writes the plot (and the JSON when asked).
pub fn run(args: SweepArgs) -> Result<()> {
    if !args.instances.is_empty() {
        return run_clusters(&args);
    }
    if args.device_tokens.is_empty() || args.host_tokens.is_empty() || args.l3.is_empty() {
        bail!("--device-tokens, --host-tokens and --l3 each need a value");
    }
    if args.l3.contains(&L3Store::Mooncake) {
        bail!("a sweep runs its points in parallel on the embedded store: --l3 off,local");
    }
    let slice = TraceSlice {
        window_ms: None,
        limit: Some(args.limit),
    };
    let trace = load_trace(args.trace.as_deref(), &slice, 1.0)?;
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let options = SweepOptions {
        trace: Arc::new(trace),
        device_tokens: args.device_tokens.clone(),
        host_tokens: args.host_tokens.clone(),
        l3: args.l3.clone(),
        jobs: jobs.max(1),
    };
    let report = with_progress("replays", |progress| run_sweep(&options, progress))
        .context("sweep failed")?;
    println!(
        "sweep {} ({} requests, {} prompt tokens; unbounded cache {:.1} %)",
        report.trace,
        report.requests,
        report.prompt_tokens,
        100.0 * report.unbounded_hit_tokens as f64 / report.prompt_tokens.max(1) as f64
    );
    println!(
        "  {:>10} {:>10} {:>6} {:>9} {:>9} {:>9} {:>9} {:>8} {:>10}",
        "device", "host", "L3", "hit", "device", "host", "L3", "aborted", "TTFT ms"
    );
    for p in &report.points {
        let pct = |n: u64| 100.0 * n as f64 / p.prompt_tokens.max(1) as f64;
        println!(
            "  {:>10} {:>10} {:>6} {:>8.1}% {:>8.1}% {:>8.1}% {:>8.1}% {:>8} {:>10.0}",
            p.device_tokens,
            p.host_tokens,
            p.l3,
            100.0 * p.hit_ratio(),
            pct(p.hit_tokens.saturating_sub(p.hit_tokens_host)),
            pct(p.hit_tokens_host.saturating_sub(p.hit_tokens_l3)),
            pct(p.hit_tokens_l3),
            p.aborted,
            p.ttft_mean_ms
        );
    }
    if let Some(path) = write_plot(args.svg.as_deref(), || report.svg())? {
        println!("  plot: {}", path.display());
    }
    crate::report::write_json(args.json.as_deref(), &report)
}

/// Runs `sweep` under a progress bar counting `what` (it reports `(done, total)`).
fn with_progress<T>(what: &str, sweep: impl FnOnce(&(dyn Fn(usize, usize) + Sync)) -> T) -> T {
    let template = format!("{{msg}} [{{bar:40}}] {{pos}}/{{len}} {what} ({{eta}})");
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template(&template)
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message("sweep");
    let result = sweep(&|done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    result
}

/// Tokens of KV as pages of 16, page 0 included.
fn pages(tokens: u64) -> Result<u32> {
    u32::try_from(tokens.div_ceil(16) + 1).context("capacity too large")
}

/// `sweep --instances ...`: the cluster grid, its table and its plot.
fn run_clusters(args: &SweepArgs) -> Result<()> {
    use kvtier_sim::cluster::{ClusterSweepOptions, L3Scope, run_cluster_sweep};
    use kvtier_sim::scenario::ScenarioOptions;
    let (Some(&device), Some(&host)) = (args.device_tokens.first(), args.host_tokens.first())
    else {
        bail!("--device-tokens and --host-tokens each need a value");
    };
    let store = match args.l3.iter().copied().find(|&l| l != L3Store::Off) {
        Some(store) => store,
        None if args.l3_scopes.iter().all(|&s| s == L3Scope::Off) => L3Store::Local,
        None => bail!("--l3-scopes private or shared need a store: --l3 local or mooncake"),
    };
    let slice = TraceSlice {
        window_ms: None,
        limit: Some(args.limit),
    };
    let trace = load_trace(args.trace.as_deref(), &slice, 1.0)?;
    let policies = args
        .routers
        .iter()
        .map(|r| r.parse::<kvtier_router::Policy>())
        .collect::<Result<Vec<_>, _>>()?;
    let options = ClusterSweepOptions {
        base: ScenarioOptions {
            device_pages: Some(pages(device)?),
            host_pages: Some(pages(host)?),
            l3: store,
            ..ScenarioOptions::trace(trace)
        },
        instances: args.instances.clone(),
        policies,
        scopes: args.l3_scopes.clone(),
    };
    let sweep = with_progress("clusters", |progress| run_cluster_sweep(&options, progress))
        .context("sweep failed")?;
    println!(
        "sweep {} on clusters ({} requests, {} prompt tokens, ideal bound {} tokens; each instance {} device and {} host tokens)",
        sweep.trace, sweep.requests, sweep.prompt_tokens, sweep.unbounded_hit_tokens, device, host
    );
    println!(
        "  {:>9} {:>12} {:>14} {:>9} {:>9} {:>9} {:>10} {:>10} {:>12} {:>9}",
        "instances",
        "router",
        "L3",
        "of ideal",
        "from L3",
        "TTFT p50",
        "TTFT p90",
        "L3 read",
        "L3 written",
        "stale"
    );
    for p in &sweep.points {
        let r = &p.report;
        let n = r.instances.max(1) as f64;
        let mib = |v: &[u64]| v.iter().sum::<u64>() as f64 / n / (1 << 20) as f64;
        println!(
            "  {:>9} {:>12} {:>14} {:>8.1}% {:>8.1}% {:>7.0}ms {:>8.0}ms {:>7.1}MiB {:>9.1}MiB {:>9}",
            p.instances,
            p.policy,
            r.l3,
            100.0 * r.hit_ratio_of_ideal,
            100.0 * r.hit_tokens_l3 as f64 / r.unbounded_hit_tokens.max(1) as f64,
            r.ttft_p50_ms,
            r.ttft_p90_ms,
            mib(&r.l3_prefetched_bytes),
            mib(&r.l3_backed_up_bytes),
            r.router.overestimated
        );
        if r.integrity_errors > 0 {
            bail!(
                "{} integrity errors at {} × {}",
                r.integrity_errors,
                p.instances,
                p.policy
            );
        }
    }
    if let Some(path) = write_plot(args.svg.as_deref(), || sweep.svg())? {
        eprintln!("plot: {}", path.display());
    }
    crate::report::write_json(args.json.as_deref(), &sweep)
}

/// Writes the plot `svg` makes where `--svg` says, if it says: the path written.
fn write_plot(
    path: Option<&std::path::Path>,
    svg: impl FnOnce() -> String,
) -> Result<Option<&std::path::Path>> {
    let Some(path) = path else {
        return Ok(None);
    };
    std::fs::write(path, svg()).with_context(|| format!("writing {}", path.display()))?;
    Ok(Some(path))
}
