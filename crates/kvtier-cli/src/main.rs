//! The `kvtier` command.
//!
//! * `kvtier replay` — the main job: replays a scenario (`chat` by default) through the
//!   scheduler with the oracle engine, which checks every KV slot it reads, and prints
//!   the report. Benchmark workloads replay through the core.
//! * `kvtier bench w1|w2|w3` — runs one benchmark workload exactly as defined in
//!   WORKLOADS.md; `--json` makes the last stdout line one JSON object.
//! * `kvtier campaign --seeds N --from S` — the seeded campaign: random workloads with
//!   faults, each run with the cache on and off under the oracle (docs/campaign.md).
//!
//! This file holds the command line and the dispatch; each command is a module
//! (`replay`, `bench`, `campaign`), and `report` prints and writes their results. The values the
//! flags take are the library's own enums.

mod bench;
mod campaign;
mod html_report;
mod replay;
mod report;
mod sweep;

use anyhow::Result;
use clap::{Parser, Subcommand};
use kvtier_sim::Path;
use kvtier_sim::oracle::Verify;
use kvtier_sim::scenario::L3Store;

use crate::bench::BenchWorkload;
use crate::replay::ReplayWorkload;

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
    Replay(Box<ReplayArgs>),
    /// Run a benchmark workload (WORKLOADS.md) and print its counters and timings.
    Bench(BenchArgs),
    /// Run the seeded campaign: random workloads with faults, cache on and off, under
    /// the integrity oracle (docs/campaign.md).
    Campaign(CampaignArgs),
    /// Replay a trace over a grid of capacities; print the table and write a plot of
    /// hit ratio against device capacity (docs/traces.md).
    Sweep(SweepArgs),
}

#[derive(Debug, Clone, Default, clap::Args)]
struct ReplayArgs {
    /// Workload to replay: a scenario through the oracle engine, or a benchmark
    /// workload through the core.
    #[arg(long, value_enum)]
    workload: Option<ReplayWorkload>,
    /// Turn the prefix cache and host tier off (every request computes its whole prompt).
    #[arg(long)]
    no_cache: bool,
    /// The model served: `dense` (full attention, the default), `mamba-hybrid`
    /// (attention and Mamba layers: a recurrent state per request, checked by the
    /// oracle too), `sliding-window` (gpt-oss-like: window layers in a paged group),
    /// `compressed-state` (DeepSeek-V4-like paged groups), or a built-in preset
    /// (`llama-3.1-8b`, `gpt-oss-20b`, `deepseek-v4-flash`, `qwen3-next-80b-a3b`, ...;
    /// docs/models.md), whose families, KV bytes per token and mid-flight gate the
    /// replay takes.
    #[arg(long, conflicts_with = "model_config")]
    model: Option<String>,
    /// The model served, from a Hugging Face `config.json` (as `--model` with a
    /// preset).
    #[arg(long)]
    model_config: Option<std::path::PathBuf>,
    /// How much KV the integrity oracle checks.
    #[arg(long, value_enum)]
    verify: Option<Verify>,
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
    /// The L3 store (default: `local` for traces, the bare replay's among them, and for
    /// longdoc; `off` for the other workloads). `mooncake` needs a cluster in the
    /// environment (run under `cargo xtask mooncake run -- ...`).
    #[arg(long, value_enum)]
    l3: Option<L3Store>,
    /// `--l3 local`: keep the store in this directory (default: a fresh temporary one,
    /// removed after the run). A second run over the same directory finds the documents
    /// of the first.
    #[arg(long)]
    l3_dir: Option<std::path::PathBuf>,
    /// Replay a Mooncake request trace (JSON Lines: timestamp, input_length,
    /// output_length, hash_ids; see docs/traces.md) through device, host and the L3
    /// store, with sparse verification unless --verify says otherwise.
    #[arg(long, conflicts_with = "workload")]
    trace: Option<std::path::PathBuf>,
    /// Traces: arrivals come this many times faster than in the trace (default 1).
    /// (A negative value reaches the check that refuses it, not the flag parser.)
    #[arg(long, allow_negative_numbers = true)]
    time_scale: Option<f64>,
    /// Traces: replay at most this many requests (a bare `replay`: 2000).
    #[arg(long)]
    limit: Option<usize>,
    /// Traces: replay the requests arriving in START..END (seconds from the trace's
    /// start; either side may be empty).
    #[arg(long)]
    window: Option<String>,
    /// Device pool in pages of 16 tokens (page 0 included) instead of the workload's.
    #[arg(long)]
    device_pages: Option<u32>,
    /// Host pool in pages of 16 tokens (page 0 included, so at least 2) instead of the
    /// workload's; `--no-cache` runs without a host tier.
    #[arg(long)]
    host_pages: Option<u32>,
    /// Serve the run's metrics (Prometheus text, refreshed every 64 steps) at
    /// http://ADDR/metrics; a loopback address (127.0.0.1:PORT or [::1]:PORT).
    #[arg(long)]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Export the run's spans and metrics over OTLP/HTTP to this collector (a base URL,
    /// e.g. http://127.0.0.1:4318); default: $OTEL_EXPORTER_OTLP_ENDPOINT, if set.
    #[arg(long)]
    otlp_endpoint: Option<String>,
    /// Publish the run's KV events, every tier's, as vLLM does (ZeroMQ PUB, msgpack
    /// batches) on this loopback endpoint (tcp://127.0.0.1:PORT or tcp://[::1]:PORT;
    /// ZeroMQ binds addresses, not host names).
    #[arg(long)]
    kv_events: Option<String>,
    /// With --kv-events: replay kept batches to late subscribers on this ROUTER
    /// endpoint (tcp://127.0.0.1:PORT).
    #[arg(long, requires = "kv_events")]
    kv_events_replay: Option<String>,
    /// Traces: report in --json how much of the first N prompts each tier holds at the
    /// end (what a router's index should answer for them).
    #[arg(long)]
    residency: Option<usize>,
    /// Write a self-contained HTML report with plots (hit ratio per tier, pool usage,
    /// TTFT distribution, L3 traffic over the virtual clock) to this file.
    #[arg(long)]
    report: Option<std::path::PathBuf>,
    /// Traces: replay on this many complete instances together, on one virtual clock,
    /// behind a router (docs/cluster.md).
    #[arg(long)]
    instances: Option<usize>,
    /// With --instances: where each request goes. `prefix` reads the instances' KV
    /// events (ZeroMQ on loopback) into an index and picks the longest cached prefix.
    #[arg(long, value_parser = ["round-robin", "least-loaded", "prefix"])]
    router: Option<String>,
    /// With --instances: one L3 store for all (`shared`, the default) or one each
    /// (`private`); `--l3 off` has none.
    #[arg(long, value_enum)]
    l3_scope: Option<kvtier_sim::cluster::L3Scope>,
    /// With --instances: the router sees an instance's events this much later (virtual
    /// milliseconds) than the step that made them ends.
    #[arg(long)]
    router_lag_ms: Option<f64>,
    /// With --instances: each instance in a process of its own (this binary again),
    /// driven over its stdin and stdout; its KV events reach the router over ZeroMQ.
    #[arg(long, requires = "instances")]
    processes: bool,
    /// Internal: serve instance N of the cluster the other flags describe on stdin and
    /// stdout (what --processes starts).
    #[arg(long, hide = true, requires = "instances")]
    member: Option<usize>,
}

#[derive(Debug, Clone, clap::Args)]
struct BenchArgs {
    /// Which workload.
    #[arg(value_enum)]
    workload: BenchWorkload,
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
    l3: Option<L3Store>,
    /// h1 / h2 / h3: the configuration variant (HYBRID-WORKLOADS.md §1).
    #[arg(long, value_enum)]
    variant: Option<kvtier_sim::hybrid::HybridVariant>,
    /// h1 / h2 / h3: kvtier's own decisions (default), or the reference scheduler's where
    /// they differ (reproduces its counters and digests).
    #[arg(long, value_enum, default_value_t = PolicyArg::Default)]
    policy: PolicyArg,
    /// h1 / h2 / h3: write one JSON line per plan (the decisions the digest pins) to this
    /// file, to compare with the reference's plans step by step.
    #[arg(long)]
    dump_plans: Option<std::path::PathBuf>,
    /// w1 / w2 / w3: time the step with an embedder's observability on: every tier's KV
    /// events published on a loopback ZeroMQ socket after each step, the metrics
    /// refreshed every 64 steps (and exported with --otlp-endpoint).
    #[arg(long)]
    observe: bool,
    /// Export spans and metrics over OTLP/HTTP to this collector (a base URL).
    #[arg(long)]
    otlp_endpoint: Option<String>,
    /// Print one JSON object as the last line of stdout.
    #[arg(long)]
    json: bool,
}

/// `--policy`: kvtier's decisions or the reference's (`kvtier_types::Policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum PolicyArg {
    Default,
    /// The reference at 350cf505 (HYBRID-WORKLOADS.md's counters).
    Reference,
    /// The reference as the PyPI wheel `tokenspeed-scheduler==0.1.0` builds it.
    ReferenceWheel,
}

impl From<PolicyArg> for kvtier_types::Policy {
    fn from(p: PolicyArg) -> Self {
        match p {
            PolicyArg::Default => kvtier_types::Policy::Default,
            PolicyArg::Reference => kvtier_types::Policy::Reference,
            PolicyArg::ReferenceWheel => kvtier_types::Policy::ReferenceWheel,
        }
    }
}

#[derive(Debug, Clone, clap::Args)]
struct CampaignArgs {
    /// How many seeds.
    #[arg(long)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Seeds run at once (default: one per core); the results do not depend on it.
    #[arg(long)]
    jobs: Option<usize>,
    /// Runs the shrinker may spend on each failing seed (0: no shrinking).
    #[arg(long, default_value_t = kvtier_sim::campaign::SHRINK_BUDGET)]
    shrink_budget: usize,
    /// Print one JSON object as the last line of stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, clap::Args)]
struct SweepArgs {
    /// The trace (default: the conversation trace built into the binary).
    #[arg(long)]
    trace: Option<std::path::PathBuf>,
    /// Replay at most this many requests (default 300).
    #[arg(long, default_value_t = 300)]
    limit: usize,
    /// Device capacities, tokens of KV, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [16384u64, 65536, 262144, 1048576])]
    device_tokens: Vec<u64>,
    /// Host capacities, tokens of KV, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1048576u64])]
    host_tokens: Vec<u64>,
    /// L3 settings, comma-separated.
    #[arg(long, value_delimiter = ',', value_enum, default_values_t = [L3Store::Off, L3Store::Local])]
    l3: Vec<L3Store>,
    /// Replays run at once (default: one per core); the results do not depend on it.
    #[arg(long)]
    jobs: Option<usize>,
    /// Write the plot here (SVG); without it, no plot is written.
    #[arg(long)]
    svg: Option<std::path::PathBuf>,
    /// Write the points as JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Sweep clusters instead: these instance counts, comma-separated, each instance
    /// with the first device and host capacity (docs/cluster.md).
    #[arg(long, value_delimiter = ',')]
    instances: Vec<usize>,
    /// With --instances: the routers, comma-separated.
    #[arg(long, value_delimiter = ',', value_parser = ["round-robin", "least-loaded", "prefix"], default_values_t = ["round-robin".to_string(), "prefix".to_string()])]
    routers: Vec<String>,
    /// With --instances: the L3 arrangements, comma-separated (`--l3` names the store:
    /// local, or mooncake under `cargo xtask mooncake run`).
    #[arg(long, value_delimiter = ',', value_enum, default_values_t = [kvtier_sim::cluster::L3Scope::Off, kvtier_sim::cluster::L3Scope::Private, kvtier_sim::cluster::L3Scope::Shared])]
    l3_scopes: Vec<kvtier_sim::cluster::L3Scope>,
}

/// A user's error is one line of causes and exit code 1, whatever `RUST_BACKTRACE`
/// says (a panic, a bug, still prints its backtrace).
fn main() -> std::process::ExitCode {
    match run_command() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run_command() -> Result<()> {
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Replay(Box::default())) {
        Command::Replay(args) => replay::run(*args),
        Command::Bench(args) => bench::run(args),
        Command::Campaign(args) => campaign::run(args),
        Command::Sweep(args) => sweep::run(args),
    }
}
