//! `kvtier replay`: the main job.

mod config_file;

use std::sync::LazyLock;

use anyhow::{Context, Result, bail};
use clap::ValueEnum;
use clap::builder::PossibleValue;
use kvtier_model::ModelKind;
use kvtier_model::ModelSpec;
use kvtier_sim::scenario::{
    CostModel, L3Store, SCENARIO_PAGE_SIZE, Scenario, ScenarioOptions, TraceWorkload,
    run_scenario_with_progress,
};
use kvtier_sim::trace::{CONVERSATION_TRACE, TraceSlice, parse_trace, read_trace};
use kvtier_sim::{Path, WorkloadKind, WorkloadOptions, run_workload};

use crate::{ReplayArgs, report};

/// What `replay` runs: a scenario through the oracle engine, or a benchmark workload
/// through the core. Its names are the library's: the scenarios', then the workloads'.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayWorkload {
    Scenario(Scenario),
    Bench(WorkloadKind),
}

impl ValueEnum for ReplayWorkload {
    fn value_variants<'a>() -> &'a [Self] {
        static ALL: LazyLock<Vec<ReplayWorkload>> = LazyLock::new(|| {
            let scenarios = Scenario::value_variants()
                .iter()
                .map(|&s| ReplayWorkload::Scenario(s));
            let benches = WorkloadKind::value_variants()
                .iter()
                .map(|&k| ReplayWorkload::Bench(k));
            scenarios.chain(benches).collect()
        });
        &ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        match self {
            ReplayWorkload::Scenario(s) => s.to_possible_value(),
            ReplayWorkload::Bench(k) => k.to_possible_value(),
        }
    }
}

use config_file::{ReplayFile, read_replay_file};

/// The path a replay drives: the actor system unless told otherwise.
fn replay_path(args: &ReplayArgs) -> Path {
    match (args.deterministic, args.runtime) {
        (true, _) => Path::Deterministic,
        (false, Some(runtime)) => runtime,
        (false, None) => Path::Actors,
    }
}

/// Requests a bare `kvtier replay` takes from the conversation trace: its first 27
/// million prompt tokens, about 20 s of wall time on 2 cores (the whole trace takes
/// minutes; docs/traces.md).
pub const DEFAULT_TRACE_REQUESTS: usize = 2000;

/// The trace at `path`, or the embedded conversation trace, sliced by `slice`.
pub fn load_trace(
    path: Option<&std::path::Path>,
    slice: &TraceSlice,
    time_scale: f64,
) -> Result<TraceWorkload> {
    let (name, requests) = match path {
        Some(path) => (
            path.file_stem()
                .map_or_else(|| "trace".into(), |s| s.to_string_lossy().into_owned()),
            read_trace(path, slice)?,
        ),
        None => (
            "conversation_trace".to_string(),
            parse_trace(CONVERSATION_TRACE, slice)?,
        ),
    };
    Ok(TraceWorkload {
        name,
        requests,
        time_scale,
    })
}

/// The trace `--trace` names (the embedded one, its first [`DEFAULT_TRACE_REQUESTS`]
/// requests, when none is named), sliced by `--window` and `--limit`, after checking
/// `--time-scale`.
fn trace_workload(args: &ReplayArgs) -> Result<TraceWorkload> {
    let scale = args.time_scale.unwrap_or(1.0);
    if !(scale.is_finite() && scale > 0.0) {
        bail!("--time-scale must be a positive number, not {scale}");
    }
    let default_limit = args.trace.is_none().then_some(DEFAULT_TRACE_REQUESTS);
    let slice = TraceSlice {
        window_ms: args
            .window
            .as_deref()
            .map(TraceSlice::parse_window)
            .transpose()?,
        limit: args.limit.or(default_limit),
    };
    load_trace(args.trace.as_deref(), &slice, scale)
}

/// `kvtier replay`.
pub fn run(args: ReplayArgs) -> Result<()> {
    let file = match &args.config {
        Some(path) => read_replay_file(path)?,
        None => ReplayFile::default(),
    };
    // Nothing named: the embedded conversation trace's first requests.
    let default_trace = args.trace.is_none() && args.workload.is_none() && file.workload.is_none();
    let workload = match (&args.trace, default_trace) {
        (Some(_), _) | (None, true) => ReplayWorkload::Scenario(Scenario::Trace),
        (None, false) => args
            .workload
            .or(file.workload)
            .unwrap_or(ReplayWorkload::Scenario(Scenario::Chat)),
    };
    let scenario = match workload {
        ReplayWorkload::Scenario(scenario) => scenario,
        ReplayWorkload::Bench(kind) => {
            let scenario_only = args.no_cache
                || args.model.is_some()
                || args.model_config.is_some()
                || args.l3.is_some()
                || args.l3_dir.is_some()
                || args.device_pages.is_some()
                || args.host_pages.is_some();
            if scenario_only {
                bail!(
                    "--no-cache, --model, --model-config, --l3, --l3-dir, --device-pages and --host-pages \
                     apply to scenarios and traces"
                );
            }
            let options = WorkloadOptions {
                path: replay_path(&args),
                ..WorkloadOptions::new(kind)
            };
            let report = run_workload(&options).context("replay failed")?;
            report::workload(&report);
            return report::write_json(args.json.as_deref(), &report);
        }
    };
    let cost = match &file.cost {
        Some(c) => c.apply(CostModel::default())?,
        None => CostModel::default(),
    };
    let traced = args.trace.is_some() || default_trace;
    if !traced && (args.limit.is_some() || args.window.is_some() || args.time_scale.is_some()) {
        bail!("--limit, --window and --time-scale apply to trace replays");
    }
    if args.limit == Some(0) {
        bail!("--limit 0 replays nothing: give at least 1 request");
    }
    if let Some(pages) = args.host_pages.filter(|&p| p < 2) {
        bail!(
            "--host-pages {pages} leaves no host pool (page 0 is reserved): give at least 2, \
             or run without the host tier with --no-cache"
        );
    }
    if args.instances == Some(0) {
        bail!("--instances 0 has nowhere to replay: give at least 1 instance");
    }
    let base = if traced {
        ScenarioOptions::trace(trace_workload(&args)?)
    } else {
        ScenarioOptions::new(scenario)
    };
    let options = ScenarioOptions {
        model: ModelKind::default(),
        cache: !args.no_cache && file.cache.unwrap_or(true),
        publish: file.publish.unwrap_or(true),
        verify: args.verify.or(file.verify).unwrap_or(base.verify),
        fail_every_nth_write_back: file.fail_every_nth_write_back.unwrap_or(0),
        fail_every_nth_load_back: file.fail_every_nth_load_back.unwrap_or(0),
        cost,
        path: replay_path(&args),
        device_pages: args.device_pages,
        host_pages: args.host_pages,
        ..base
    };
    let options = served_model(
        args.model.as_deref().or(file.model.as_deref()),
        args.model_config
            .as_deref()
            .or(file.model_config.as_deref()),
        options,
    )?;
    let l3 = args.l3.or(file.l3).unwrap_or(options.l3);
    let l3_dir = args.l3_dir.clone().or(file.l3_dir);
    if l3_dir.is_some() && l3 != L3Store::Local {
        bail!("--l3-dir applies to the local L3 store (--l3 local)");
    }
    // Spans and metrics go out while the run lasts; dropping the exporters flushes them.
    let otlp = args
        .otlp_endpoint
        .clone()
        .map(kvtier::telemetry::TelemetryConfig::new)
        .or_else(kvtier::telemetry::TelemetryConfig::from_env);
    let telemetry = match otlp {
        Some(config) => {
            let telemetry = kvtier::telemetry::init(&config)?;
            eprintln!("exporting spans and metrics to {}", config.endpoint);
            Some(telemetry)
        }
        None => None,
    };
    // The run's stats, refreshed by the replay, go to the endpoint's text and to the
    // OpenTelemetry export.
    let metrics = (args.metrics_addr.is_some() || telemetry.is_some()).then(|| {
        let sink = kvtier_sim::scenario::MetricsSink::default();
        match &telemetry {
            Some(telemetry) => sink.exporting(telemetry),
            None => sink,
        }
    });
    let _server = match (args.metrics_addr, &metrics) {
        (Some(addr), Some(sink)) => {
            if !addr.ip().is_loopback() {
                bail!("--metrics-addr must be a loopback address, not {addr}");
            }
            let server =
                kvtier_sim::scenario::MetricsServer::serve(addr, std::sync::Arc::clone(&sink.text))
                    .with_context(|| format!("serving metrics at {addr}"))?;
            eprintln!("metrics: http://{}/metrics", server.addr());
            Some(server)
        }
        _ => None,
    };
    let kv_events = match &args.kv_events {
        Some(endpoint) => {
            for endpoint in std::iter::once(endpoint).chain(&args.kv_events_replay) {
                if !is_loopback_endpoint(endpoint) {
                    bail!(
                        "KV event endpoints must be tcp:// on a loopback address \
                         (tcp://127.0.0.1:PORT or tcp://[::1]:PORT; ZeroMQ binds addresses, \
                         not host names), not {endpoint}"
                    );
                }
            }
            let publisher = kvtier::kv_publisher::KvEventPublisher::start(
                kvtier::kv_publisher::PublisherConfig {
                    replay_endpoint: args.kv_events_replay.clone(),
                    data_parallel_rank: Some(0),
                    ..kvtier::kv_publisher::PublisherConfig::new(endpoint.as_str(), "kv-events")
                },
            )?;
            eprintln!("KV events: {}", publisher.endpoint());
            Some(kvtier_sim::scenario::KvEventsSink(std::sync::Arc::new(
                publisher,
            )))
        }
        None => None,
    };
    let options = ScenarioOptions {
        l3,
        l3_dir,
        metrics,
        kv_events,
        residency: args.residency.unwrap_or(0),
        timeline: args.report.is_some(),
        ..options
    };
    if let Some(instances) = args.instances {
        return run_cluster(&args, options, instances);
    }
    if args.router.is_some() || args.l3_scope.is_some() || args.router_lag_ms.is_some() {
        bail!("--router, --l3-scope and --router-lag-ms apply with --instances");
    }
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} requests")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(format!(
        "replay {}",
        options
            .trace
            .as_ref()
            .map_or(scenario.name(), |t| t.name.as_str())
    ));
    let report = run_scenario_with_progress(&options, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })
    .context("replay failed")?;
    bar.finish_and_clear();
    report::scenario(&report);
    report::write_json(args.json.as_deref(), &report)?;
    if let Some(path) = &args.report {
        std::fs::write(path, crate::html_report::render(&report))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("report: {}", path.display());
    }
    if report.integrity_errors > 0 {
        bail!(
            "{} integrity errors; first: {:?}",
            report.integrity_errors,
            report.first_errors.first()
        );
    }
    Ok(())
}

/// `replay --instances N`: the trace on N instances behind the router.
fn run_cluster(args: &ReplayArgs, options: ScenarioOptions, instances: usize) -> Result<()> {
    use kvtier_sim::cluster::{ClusterOptions, L3Scope, run_cluster};
    if options.trace.is_none() {
        bail!("--instances replays a trace (--trace, or nothing for the embedded one)");
    }
    if options.kv_events.is_some() || options.metrics.is_some() || options.timeline {
        bail!("--kv-events, --metrics-addr, --otlp-endpoint and --report apply to one instance");
    }
    let policy: kvtier_router::Policy = args.router.as_deref().unwrap_or("round-robin").parse()?;
    let scope = match (args.l3_scope, options.l3_on()) {
        (_, false) => L3Scope::Off,
        (Some(scope), true) => scope,
        (None, true) => L3Scope::Shared,
    };
    let cluster = ClusterOptions {
        router_lag_us: args.router_lag_ms.unwrap_or(0.0) * 1e3,
        ..ClusterOptions::new(options, instances, policy, scope)
    };
    if let Some(i) = args.member {
        // A member process: its stdout is the protocol's.
        let member = kvtier_sim::cluster::local_member(&cluster, i, None)?;
        let stdin = std::io::stdin();
        return Ok(kvtier_sim::cluster::serve(
            member,
            stdin.lock(),
            std::io::stdout(),
        )?);
    }
    eprintln!(
        "replaying on {instances} instances{}, {} routing, L3 {}",
        if args.processes {
            " (a process each)"
        } else {
            ""
        },
        policy.name(),
        scope.name()
    );
    let report = if args.processes {
        if scope == L3Scope::Shared && cluster.base.l3 == L3Store::Local {
            bail!(
                "processes cannot share the embedded store: --l3 mooncake, or --l3-scope private"
            );
        }
        let exe = std::env::current_exe().context("finding this binary")?;
        let argv: Vec<String> = std::env::args()
            .skip(1)
            .filter(|a| a != "--processes")
            .collect();
        let members = (0..instances)
            .map(|i| {
                let mut command = std::process::Command::new(&exe);
                command.args(&argv).args(["--member", &i.to_string()]);
                kvtier_sim::cluster::Remote::spawn(command)
                    .map(|m| Box::new(m) as Box<dyn kvtier_sim::cluster::Member>)
            })
            .collect::<Result<Vec<_>, _>>()?;
        kvtier_sim::cluster::run_members(&cluster, members, |_, _| {})
    } else {
        run_cluster(&cluster)
    }
    .context("cluster replay failed")?;
    report::cluster(&report);
    report::write_json(args.json.as_deref(), &report)?;
    if report.integrity_errors > 0 {
        bail!("{} integrity errors", report.integrity_errors);
    }
    Ok(())
}

/// The model a replay serves: a kind (`dense`, `mamba-hybrid`, `sliding-window`,
/// `compressed-state`), a built-in preset, or a `config.json`. A preset or config sets
/// the family (dense, Mamba hybrid with its scan chunk, or paged groups), the KV bytes
/// per token of the virtual clock and the mid-flight gate; the oracle engine keeps
/// its small checked geometry.
/// `tcp://` on a loopback address (`127.0.0.1`, `[::1]`, `localhost`).
fn is_loopback_endpoint(endpoint: &str) -> bool {
    let Some(address) = endpoint.strip_prefix("tcp://") else {
        return false;
    };
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    host.trim_matches(['[', ']'])
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

fn served_model(
    name: Option<&str>,
    config: Option<&std::path::Path>,
    options: ScenarioOptions,
) -> Result<ScenarioOptions> {
    let spec = match (name, config) {
        (Some(_), Some(_)) => bail!("--model and --model-config name the model twice: give one"),
        (None, None) => return Ok(options),
        (None, Some(path)) => ModelSpec::from_config_file(path)?,
        (Some(name), None) => match ModelKind::from_name(name) {
            Some(model) => return Ok(ScenarioOptions { model, ..options }),
            None => ModelSpec::preset(name)?,
        },
    };
    // A paged model's groups (pool sizes are the run's to set).
    let groups = spec.paged_templates(SCENARIO_PAGE_SIZE);
    let gate = spec.gate(SCENARIO_PAGE_SIZE);
    let mut cost = options.cost;
    let kv_bytes = spec.kv.map_or(0, |kv| kv.bytes_per_token());
    if kv_bytes > 0 {
        cost.kv_bytes_per_token = kv_bytes as f64;
    }
    Ok(ScenarioOptions {
        model: spec.kind(),
        groups,
        state_chunk: spec.state.map(|s| s.checkpoint_chunk),
        publish: options.publish && gate.enabled,
        publish_cap: gate.max_pages,
        model_label: Some(spec.name.clone()),
        cost,
        ..options
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtier_sim::oracle::Verify;

    #[test]
    fn the_example_replay_config_parses() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/replay.example.toml"
        );
        let file = read_replay_file(std::path::Path::new(path)).expect("example parses");
        assert_eq!(
            file.workload,
            Some(ReplayWorkload::Scenario(Scenario::Rollout))
        );
        let cost = file
            .cost
            .expect("cost section")
            .apply(CostModel::default())
            .expect("valid");
        assert_eq!(cost.h2d_gbps, 50.0);
    }

    /// A bare `kvtier replay` replays the embedded conversation trace's first requests;
    /// trace flags are refused for the other workloads.
    #[test]
    fn the_default_replay_is_the_embedded_conversation_trace() {
        let trace = trace_workload(&ReplayArgs::default()).expect("the embedded trace parses");
        assert_eq!(trace.requests.len(), DEFAULT_TRACE_REQUESTS);
        assert_eq!(trace.time_scale, 1.0);
        let windowed = ReplayArgs {
            window: Some("0..10".into()),
            limit: Some(1000),
            ..ReplayArgs::default()
        };
        let trace = trace_workload(&windowed).expect("valid slice");
        assert!(trace.requests.iter().all(|r| r.timestamp_ms < 10_000));
        let bad_scale = ReplayArgs {
            time_scale: Some(0.0),
            ..ReplayArgs::default()
        };
        assert!(trace_workload(&bad_scale).is_err());
        let chat_with_limit = ReplayArgs {
            workload: Some(ReplayWorkload::Scenario(Scenario::Chat)),
            limit: Some(3),
            ..ReplayArgs::default()
        };
        let err = run(chat_with_limit).unwrap_err();
        assert!(err.to_string().contains("apply to trace replays"), "{err}");
    }

    /// `--model` takes a kind or a preset, `--model-config` a file: a preset sets the
    /// family, the label, the virtual clock's KV bytes and the gate; a window or
    /// compressed-state model gets its paged-cache groups.
    #[test]
    fn models_from_presets_and_configs() {
        let base = || ScenarioOptions::new(Scenario::Chat);
        let kind = served_model(Some("mamba-hybrid"), None, base()).expect("a kind");
        assert_eq!(
            (kind.model, kind.model_label),
            (ModelKind::MambaHybrid, None)
        );
        let next = served_model(Some("qwen3-next-80b-a3b"), None, base()).expect("a preset");
        assert_eq!(next.model, ModelKind::MambaHybrid);
        assert_eq!(next.model_label.as_deref(), Some("qwen3-next-80b-a3b"));
        assert_eq!(next.state_chunk, Some(64));
        assert_eq!(next.cost.kv_bytes_per_token, 24_576.0);
        let llama = served_model(Some("llama-3.1-8b"), None, base()).expect("a preset");
        assert_eq!(
            (llama.model, llama.publish, llama.publish_cap),
            (ModelKind::Dense, true, None)
        );
        let oss = served_model(Some("gpt-oss-20b"), None, base()).expect("a preset");
        let groups = oss.groups.expect("paged groups");
        assert_eq!(oss.model, ModelKind::SlidingWindow);
        assert_eq!(groups.required, ["swa.kv"]);
        assert_eq!(groups.groups[0].window(), Some(128));
        let v4 = served_model(Some("deepseek-v4-flash"), None, base()).expect("a preset");
        assert_eq!(v4.model, ModelKind::CompressedState);
        assert_eq!(v4.groups.expect("paged groups").groups.len(), 6);
        let err = served_model(Some("gpt-7"), None, base()).unwrap_err();
        assert!(
            err.to_string().contains("unknown model preset `gpt-7`"),
            "{err}"
        );

        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("config.json");
        std::fs::write(
            &path,
            r#"{"model_type": "mistral", "num_hidden_layers": 2, "num_attention_heads": 4,
                "head_dim": 8, "max_position_embeddings": 4096, "sliding_window": 100}"#,
        )
        .expect("written");
        let mistral = served_model(None, Some(&path), base()).expect("a config");
        assert_eq!(mistral.model_label.as_deref(), Some("mistral"));
        // floor(100 / 16) pages at the scenarios' page size.
        assert_eq!((mistral.publish, mistral.publish_cap), (true, Some(6)));
        std::fs::write(&path, r#"{"model_type": "t5"}"#).expect("written");
        let err = served_model(None, Some(&path), base()).unwrap_err();
        assert!(err.to_string().contains("`t5`"), "{err}");
    }

    #[test]
    fn config_values_take_the_flags_names() {
        let file: ReplayFile =
            toml::from_str("workload = \"w2\"\nverify = \"sampled\"\nl3 = \"mooncake\"")
                .expect("parses");
        assert_eq!(file.workload, Some(ReplayWorkload::Bench(WorkloadKind::W2)));
        assert_eq!(file.verify, Some(Verify::SAMPLED));
        assert_eq!(file.l3, Some(L3Store::Mooncake));
        let names: Vec<String> = ReplayWorkload::value_variants()
            .iter()
            .filter_map(|w| Some(w.to_possible_value()?.get_name().to_string()))
            .collect();
        assert_eq!(names, ["chat", "rollout", "longdoc", "w1", "w2", "w3"]);
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
        let bad_enum = toml::from_str::<ReplayFile>("verify = \"most\"").unwrap_err();
        assert!(
            bad_enum.to_string().contains(
                "unknown variant `most`, expected one of `full`, `sampled`, `sparse`, `off`"
            ),
            "{bad_enum}"
        );
        let bad_type = toml::from_str::<ReplayFile>("l3 = true").unwrap_err();
        assert!(
            bad_type.to_string().contains("wanted string or table"),
            "{bad_type}"
        );
        let cost: ReplayFile = toml::from_str("[cost]\nh2d_gbps = 0").expect("parses");
        let err = cost
            .cost
            .expect("cost")
            .apply(CostModel::default())
            .unwrap_err();
        assert!(err.to_string().contains("h2d_gbps"), "{err}");
    }

    /// KV events and the OTLP export go to loopback only, and say so when told
    /// otherwise.
    #[test]
    fn observability_endpoints_must_be_loopback() {
        for ok in ["tcp://127.0.0.1:5557", "tcp://[::1]:5557"] {
            assert!(is_loopback_endpoint(ok), "{ok}");
        }
        // ZeroMQ binds addresses: a host name fails at bind with an unrelated error.
        for bad in [
            "tcp://localhost:0",
            "tcp://0.0.0.0:5557",
            "tcp://10.0.0.1:5557",
            "ipc:///tmp/x",
            "127.0.0.1:5557",
        ] {
            assert!(!is_loopback_endpoint(bad), "{bad}");
        }
        let args = ReplayArgs {
            kv_events: Some("tcp://0.0.0.0:5557".into()),
            limit: Some(1),
            ..ReplayArgs::default()
        };
        let err = run(args).expect_err("refused");
        assert!(err.to_string().contains("loopback"), "{err}");
        let args = ReplayArgs {
            otlp_endpoint: Some("grpc://127.0.0.1:4317".into()),
            limit: Some(1),
            ..ReplayArgs::default()
        };
        let err = run(args).expect_err("refused");
        assert!(err.to_string().contains("http://"), "{err}");
    }
}
