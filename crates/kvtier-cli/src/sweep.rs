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
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} replays ({eta})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message("sweep");
    let report = run_sweep(&options, |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })
    .context("sweep failed")?;
    bar.finish_and_clear();
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
    std::fs::write(&args.svg, report.svg())
        .with_context(|| format!("writing {}", args.svg.display()))?;
    println!("  plot: {}", args.svg.display());
    crate::report::write_json(args.json.as_deref(), &report)
}
