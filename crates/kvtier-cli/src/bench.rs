//! `kvtier bench`: a benchmark workload (WORKLOADS.md), the page-copy bandwidth, or the
//! L3 transfer throughput.

use std::sync::LazyLock;

use anyhow::{Context, Result, bail};
use clap::ValueEnum;
use clap::builder::PossibleValue;
use kvtier_sim::hybrid::{HybridOptions, HybridVariant, run_hybrid};
use kvtier_sim::l3_bench::{L3BenchOptions, run_l3_bench};
use kvtier_sim::scenario::L3Store;
use kvtier_sim::{WorkloadKind, WorkloadOptions, run_workload};

use crate::{BenchArgs, report};

/// `--observe`: KV events on a loopback PUB socket, the metrics as text and, with
/// telemetry, exported.
fn observe(telemetry: Option<&kvtier::telemetry::Telemetry>) -> Result<kvtier_sim::Observe> {
    let publisher =
        kvtier::kv_publisher::KvEventPublisher::bind("tcp://127.0.0.1:0", "kv-events", Some(0))?;
    let mut metrics = kvtier_sim::scenario::MetricsSink::default();
    if let Some(telemetry) = telemetry {
        metrics = metrics.exporting(telemetry);
    }
    Ok(kvtier_sim::Observe {
        kv_events: Some(kvtier_sim::scenario::KvEventsSink(std::sync::Arc::new(
            publisher,
        ))),
        metrics: Some(metrics),
    })
}

/// What `bench` measures: a scheduler workload (the library's names), or one of the two
/// data-plane benchmarks only this command runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchWorkload {
    Scheduler(WorkloadKind),
    /// A hybrid workload (HYBRID-WORKLOADS.md): H1, H2 or H3.
    Hybrid(HybridFamily),
    Copy,
    L3,
}

/// The hybrid workloads `bench` runs; `--variant` picks the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HybridFamily {
    H1,
    H2,
    H3,
}

impl HybridFamily {
    /// Its main variant, and whether `v` is one of its variants.
    fn main_variant(self) -> HybridVariant {
        match self {
            HybridFamily::H1 => HybridVariant::H1Main,
            HybridFamily::H2 => HybridVariant::H2Main,
            HybridFamily::H3 => HybridVariant::H3Main,
        }
    }

    fn name(self) -> &'static str {
        match self {
            HybridFamily::H1 => "h1",
            HybridFamily::H2 => "h2",
            HybridFamily::H3 => "h3",
        }
    }
}

impl ValueEnum for BenchWorkload {
    fn value_variants<'a>() -> &'a [Self] {
        static ALL: LazyLock<Vec<BenchWorkload>> = LazyLock::new(|| {
            let workloads = WorkloadKind::value_variants()
                .iter()
                .map(|&k| BenchWorkload::Scheduler(k));
            workloads
                .chain([
                    BenchWorkload::Hybrid(HybridFamily::H1),
                    BenchWorkload::Hybrid(HybridFamily::H2),
                    BenchWorkload::Hybrid(HybridFamily::H3),
                    BenchWorkload::Copy,
                    BenchWorkload::L3,
                ])
                .collect()
        });
        &ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        match self {
            BenchWorkload::Scheduler(k) => k.to_possible_value(),
            BenchWorkload::Hybrid(HybridFamily::H1) => {
                Some(PossibleValue::new("h1").help(
                    "Mamba hybrid, multi-turn over shared system prompts (HYBRID-WORKLOADS.md)",
                ))
            }
            BenchWorkload::Hybrid(HybridFamily::H2) => Some(
                PossibleValue::new("h2")
                    .help("DeepSeek-V4 paged-cache groups, multi-turn over shared documents"),
            ),
            BenchWorkload::Hybrid(HybridFamily::H3) => {
                Some(PossibleValue::new("h3").help("Mamba hybrid under state-slot exhaustion"))
            }
            BenchWorkload::Copy => Some(
                PossibleValue::new("copy")
                    .help("Page-copy bandwidth of the kernel library against memcpy (bench only)"),
            ),
            BenchWorkload::L3 => Some(PossibleValue::new("l3").help(
                "Prefetch and backup throughput through the L3 actor against the raw store \
                 (bench only)",
            )),
        }
    }
}

/// `kvtier bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    if args.l3.is_some() && args.workload != BenchWorkload::L3 {
        bail!("--l3 applies to `bench l3`");
    }
    if args.variant.is_some() && !matches!(args.workload, BenchWorkload::Hybrid(_)) {
        bail!("--variant applies to the hybrid workloads h1, h2 and h3");
    }
    let kind = match args.workload {
        BenchWorkload::Scheduler(kind) => kind,
        BenchWorkload::Hybrid(family) => return hybrid(family, &args),
        BenchWorkload::Copy => return copy(args.json),
        BenchWorkload::L3 => return l3(args.l3.unwrap_or(L3Store::Local), args.json),
    };
    if args.l2 && kind != WorkloadKind::W1 {
        bail!("--l2 applies to w1 only (w3 always has a host tier, w2 never)");
    }
    if kind == WorkloadKind::W3 && args.page_size != 64 {
        bail!("w3 is defined at --page-size 64 only");
    }
    if args.measure_pass.is_some() && kind != WorkloadKind::W1 {
        bail!("--measure-pass applies to w1 only");
    }
    let telemetry = match &args.otlp_endpoint {
        Some(endpoint) => Some(kvtier::telemetry::init(
            &kvtier::telemetry::TelemetryConfig::new(endpoint.as_str()),
        )?),
        None => None,
    };
    let options = WorkloadOptions {
        kind,
        page_size: args.page_size,
        l2: args.l2,
        requests: args.requests,
        measure_pass: args.measure_pass,
        kv_events: args.kv_events,
        path: args.runtime,
        record_plans: false,
        observe: if args.observe {
            observe(telemetry.as_ref())?
        } else {
            kvtier_sim::Observe::default()
        },
    };
    let report = run_workload(&options).context("bench failed")?;
    report::workload(&report);
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(())
}

/// `kvtier bench h1|h2|h3`.
fn hybrid(family: HybridFamily, args: &BenchArgs) -> Result<()> {
    let variant = args.variant.unwrap_or(family.main_variant());
    if !variant.name().starts_with(family.name()) {
        bail!(
            "{} is a variant of {}, not of {}",
            variant.name(),
            &variant.name()[..2],
            family.name()
        );
    }
    let options = HybridOptions {
        variant,
        path: args.runtime,
        policy: args.policy.into(),
        record_plans: args.dump_plans.is_some(),
    };
    let report = run_hybrid(&options).context("bench failed")?;
    if let Some(path) = &args.dump_plans {
        let mut text = report.plans.join("\n");
        text.push('\n');
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    report::hybrid(&report);
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(())
}

/// `kvtier bench copy`: write-back bandwidth of the kernel library against plain memcpy
/// of the same bytes, for pages of 16 KiB to 1 MiB.
fn copy(json: bool) -> Result<()> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    report::copy_header(threads);
    let mut rows = Vec::new();
    for kib in [16u32, 64, 256, 1024] {
        let r = kvtier_device::bench::measure_copy(kib, 7, threads)?;
        report::copy_row(kib, &r);
        rows.push((kib, r));
    }
    if json {
        println!("{}", report::copy_json(threads, &rows));
    }
    Ok(())
}

/// `kvtier bench l3`: prefetch and backup through the L3 actor against the raw store's
/// get and put of the same pages.
fn l3(store: L3Store, json: bool) -> Result<()> {
    if store == L3Store::Off {
        bail!("bench l3 needs a store: --l3 local or --l3 mooncake");
    }
    let options = L3BenchOptions::new(store);
    report::l3_header(&options);
    let r = run_l3_bench(&options).context("bench l3 failed")?;
    report::l3_table(&r);
    if json {
        println!("{}", report::l3_json(&r));
    }
    Ok(())
}
