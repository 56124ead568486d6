//! The `kvtier` command against real consumers of what it emits: its spans received by
//! a real OTLP/HTTP receiver (oteltap, through `tools/otel/receive.py`), its KV events
//! indexed by a real router index (Dynamo's, through `tools/dynamo/indexer_check.py`).
//!
//! `cargo xtask ci` installs the tools and names them in the environment; without one
//! a test says loudly that it skipped, and under `CI=true` it fails instead.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};

use kvtier_tests::tool_from_env;
use serde_json::Value;

mod common;

use common::{KVTIER, replay_report, repo};

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binds");
    listener.local_addr().expect("an address").port()
}

/// `kvtier replay` of the conversation trace's first `limit` requests, with `extra`
/// flags; answers its JSON report.
fn replay(limit: usize, extra: &[&str], dir: &Path, name: &str) -> Value {
    let limit = limit.to_string();
    replay_report(&[&["--limit", limit.as_str()], extra].concat(), dir, name)
}

/// The counters two runs must agree on, whatever is exported.
fn counters(report: &Value) -> Value {
    let mut report = report.clone();
    if let Some(map) = report.as_object_mut() {
        // Wall-clock timings (`scheduler_ns`), and whether the run said why hits were
        // lost (watched runs do). Everything else, token counts included, must match.
        map.retain(|key, _| !key.ends_with("_ns") && !key.starts_with("lost_hit"));
    }
    report
}

fn attr<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["attributes"].get(key)
}

fn number(span: &Value, key: &str) -> u64 {
    attr(span, key).and_then(Value::as_u64).unwrap_or(0)
}

#[test]
fn a_replays_spans_reach_a_real_otlp_receiver() {
    let Some(python) = tool_from_env("KVTIER_OTELTAP_PYTHON", "oteltap") else {
        return;
    };
    let dir = tempfile::tempdir().expect("a scratch directory");
    let port = free_port();
    let spans_file = dir.path().join("spans.jsonl");
    let metrics_file = dir.path().join("metrics.jsonl");
    let mut receiver = Command::new(python)
        .arg(repo().join("tools/otel/receive.py"))
        .arg(port.to_string())
        .arg(&spans_file)
        .arg("--metrics")
        .arg(&metrics_file)
        // Quiet for 10 s: the replay has ended and flushed (a slow CI machine pauses).
        .args(["--idle", "10", "--max", "300"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("the receiver starts");
    let mut ready = String::new();
    BufReader::new(receiver.stdout.take().expect("stdout"))
        .read_line(&mut ready)
        .expect("the receiver says it is ready");
    assert_eq!(ready.trim(), "READY");

    const REQUESTS: usize = 40;
    let endpoint = format!("http://127.0.0.1:{port}");
    let exported = replay(
        REQUESTS,
        &["--otlp-endpoint", &endpoint],
        dir.path(),
        "live",
    );
    assert!(receiver.wait().expect("the receiver ends").success());
    // A receiver that is down loses spans, never requests: the same run, same counters.
    let dead = format!("http://127.0.0.1:{}", free_port());
    let lost = replay(REQUESTS, &["--otlp-endpoint", &dead], dir.path(), "dead");
    let plain = replay(REQUESTS, &[], dir.path(), "plain");
    assert!(
        counters(&plain)["hit_tokens"].as_u64() > Some(0),
        "token counts compared"
    );
    assert_eq!(counters(&exported), counters(&plain));
    assert_eq!(counters(&lost), counters(&plain));

    let spans: Vec<Value> = std::fs::read_to_string(&spans_file)
        .expect("the receiver wrote its spans")
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON span"))
        .collect();
    let by_id: BTreeMap<&str, &Value> = spans
        .iter()
        .map(|s| (s["span_id"].as_str().expect("an id"), s))
        .collect();
    let requests: Vec<&Value> = spans.iter().filter(|s| s["name"] == "request").collect();
    assert_eq!(requests.len(), REQUESTS, "one request span per request");
    let mut traces = std::collections::BTreeSet::new();
    let mut cached = 0;
    let mut looked_up = 0;
    for request in &requests {
        let id = attr(request, "gen_ai.request.id").expect("gen_ai.request.id");
        assert!(
            request["parent_span_id"].is_null(),
            "{id}: a trace of its own"
        );
        assert!(
            traces.insert(request["trace_id"].as_str()),
            "{id}: one trace each"
        );
        assert!(number(request, "gen_ai.usage.prompt_tokens") > 0, "{id}");
        assert!(
            attr(request, "gen_ai.usage.completion_tokens").is_some(),
            "{id}"
        );
        assert_eq!(
            attr(request, "kvtier.outcome").and_then(Value::as_str),
            Some("finished")
        );
        let hit = number(request, "gen_ai.usage.cached_tokens");
        let tiers: u64 = ["device", "host", "l3"]
            .iter()
            .map(|t| number(request, &format!("kvtier.cached_tokens.{t}")))
            .sum();
        assert_eq!(tiers, hit, "{id}: the tiers split the cached tokens");
        cached += hit;
        // Its phases: child spans in the same trace, in the order of its life.
        let copies = ["write_back", "retract_copy", "load_back"];
        let mut phases: Vec<&Value> = spans
            .iter()
            .filter(|s| s["parent_span_id"] == request["span_id"])
            .filter(|s| !copies.iter().any(|c| s["name"] == *c))
            .collect();
        phases.sort_by_key(|s| s["start_ns"].as_u64());
        assert!(phases.iter().all(|p| p["trace_id"] == request["trace_id"]));
        let names: Vec<&str> = phases.iter().filter_map(|p| p["name"].as_str()).collect();
        // Long prompts wait for their L3 lookup first.
        let start = usize::from(names.first() == Some(&"looking_up"));
        assert_eq!(names.get(start), Some(&"queued"), "{id}: {names:?}");
        looked_up += start;
        assert_eq!(names.last(), Some(&"finished"), "{id}: {names:?}");
        assert!(names.contains(&"prefilling"), "{id}: {names:?}");
        // One token comes with the prefill; more need decode steps.
        if number(request, "gen_ai.usage.completion_tokens") > 1 {
            assert!(names.contains(&"decoding"), "{id}: {names:?}");
        }
    }
    assert!(cached > 0, "the conversation trace reuses prefixes");
    // The copies done for a request: its write-backs (and retraction copies) under its
    // span, the L3 backup of the written pages under the copy, each with its pages.
    let named =
        |name: &str| -> Vec<&Value> { spans.iter().filter(|s| s["name"] == name).collect() };
    let (write_backs, backups) = (named("write_back"), named("backup"));
    assert!(!write_backs.is_empty() && !backups.is_empty());
    for write_back in &write_backs {
        let parent = by_id[write_back["parent_span_id"].as_str().expect("a parent")];
        assert_eq!(parent["name"], "request");
        assert!(number(write_back, "kvtier.pages") > 0);
    }
    for backup in &backups {
        let parent = by_id[backup["parent_span_id"].as_str().expect("a parent")];
        let copied_by = parent["name"].as_str();
        assert!(
            matches!(copied_by, Some("write_back" | "retract_copy")),
            "{copied_by:?}"
        );
        assert_eq!(backup["trace_id"], parent["trace_id"]);
    }
    assert!(
        looked_up > 0,
        "some prompts are long enough for an L3 lookup"
    );
    // Every span's parent was exported, and its resource names the service.
    for span in &spans {
        if let Some(parent) = span["parent_span_id"].as_str() {
            assert!(by_id.contains_key(parent), "{span}");
        }
    }
    assert!(
        spans
            .iter()
            .any(|s| s["resource"]["service.name"] == "kvtier"),
        "service.name"
    );

    // The metrics, as OpenTelemetry metrics: the last point of each series is the
    // run's final value.
    let mut last: BTreeMap<(String, String), Value> = BTreeMap::new();
    for line in std::fs::read_to_string(&metrics_file)
        .expect("the receiver wrote the metrics")
        .lines()
    {
        let point: Value = serde_json::from_str(line).expect("a JSON point");
        let key = (
            point["name"].as_str().unwrap_or_default().to_owned(),
            point["attributes"].to_string(),
        );
        last.insert(key, point);
    }
    let point = |name: &str, attributes: &str| {
        last.get(&(name.to_owned(), attributes.to_owned()))
            .unwrap_or_else(|| panic!("no {name} {attributes} among {:?}", last.keys()))
    };
    let queries = point("tokenspeed.prefix_cache_queries", "{}");
    assert_eq!(queries["type"], "sum");
    assert_eq!(queries["monotonic"], true);
    assert_eq!(queries["value"], exported["prompt_tokens"]);
    let hits: u64 = ["device", "host", "l3"]
        .iter()
        .map(|tier| {
            let attributes = format!("{{\"tier\":\"{tier}\"}}");
            point("kvtier_prefix_hit_tokens", &attributes)["value"]
                .as_u64()
                .expect("a count")
        })
        .sum();
    assert_eq!(Some(hits), exported["hit_tokens"].as_u64());
    let ttft = point("gen_ai.server.time_to_first_token", "{}");
    assert_eq!(ttft["type"], "histogram");
    assert_eq!(
        ttft["count"].as_u64(),
        Some(REQUESTS as u64),
        "one per request"
    );
    let buckets: u64 = ttft["bucket_counts"]
        .as_array()
        .expect("buckets")
        .iter()
        .filter_map(Value::as_u64)
        .sum();
    assert_eq!(buckets, REQUESTS as u64);
    assert_eq!(
        point("kvtier_step_duration_seconds", "{}")["type"],
        "histogram"
    );
}

/// Whether this process is root (then `unshare -n` needs no user namespace).
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| out.stdout.trim_ascii() == b"0")
}

/// A replay's KV events, every tier's, read by Dynamo's standalone KV indexer (PyPI
/// `ai-dynamo-runtime` 1.6.1), which subscribes to the PUB socket and asks the ROUTER
/// socket for what it missed while joining. At the end its per-tier answers for the
/// first prompts equal kvtier's own cache state (the radix cache's probe, the L3
/// store's lookup), in the indexer's cumulative terms: `gpu` the leading tokens on
/// device; `cpu` those and the host run after them; `disk` those and the L3 run after.
/// Everything runs in a private network namespace: the indexer's HTTP server binds
/// every interface.
#[test]
fn dynamos_indexer_sees_kvtiers_cache() {
    let Some(python) = tool_from_env("KVTIER_DYNAMO_PYTHON", "Dynamo's KV indexer") else {
        return;
    };
    let dir = tempfile::tempdir().expect("a scratch directory");
    // A roomy host tier (the device copies go once written back), and a small one
    // (device copies stay, host evicts).
    for (name, host) in [("roomy", None), ("small-host", Some("3000"))] {
        let report = dir.path().join(format!("{name}.json"));
        let answers = dir.path().join(format!("{name}-answers.json"));
        let mut replay = vec![
            "--trace".to_string(),
            "data/mooncake-traces/conversation_trace.jsonl".into(),
            "--limit".into(),
            "120".into(),
            "--residency".into(),
            "24".into(),
        ];
        if let Some(pages) = host {
            replay.extend(["--host-pages".into(), pages.into()]);
        }
        let script = format!(
            "ip link set lo up && exec {python} tools/dynamo/indexer_check.py {KVTIER} {} {} -- {}",
            report.display(),
            answers.display(),
            replay.join(" ")
        );
        let unshare = if is_root() { "-n" } else { "-rn" };
        let status = Command::new("unshare")
            .arg(unshare)
            .args(["sh", "-c", &script])
            .current_dir(repo())
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .status()
            .expect("unshare runs");
        assert!(status.success(), "{name}: the indexer check failed");
        let report: Value =
            serde_json::from_slice(&std::fs::read(&report).expect("the report")).expect("JSON");
        let answers: Value =
            serde_json::from_slice(&std::fs::read(&answers).expect("answers")).expect("JSON");
        let residency = report["residency"].as_array().expect("residency");
        let answers = answers.as_array().expect("answers");
        assert_eq!(residency.len(), 24, "{name}");
        assert_eq!(answers.len(), residency.len(), "{name}");
        let mut seen = [0u64; 3];
        for (ours, theirs) in residency.iter().zip(answers) {
            let id = &ours["request_id"];
            assert_eq!(&theirs["request_id"], id);
            let tokens = |key: &str| ours[key].as_u64().expect("a count");
            let device = tokens("device_tokens");
            let host = device.max(tokens("host_tokens"));
            let storage = host.max(tokens("storage_tokens"));
            let answer = |key: &str| theirs[key].as_u64().expect("a count");
            assert_eq!(
                [answer("gpu"), answer("cpu"), answer("disk")],
                [device, host, storage],
                "{name} {id}: the indexer's gpu/cpu/disk against kvtier's device/host/L3"
            );
            for (total, tier) in
                seen.iter_mut()
                    .zip(["device_tokens", "host_tokens", "storage_tokens"])
            {
                *total += tokens(tier);
            }
        }
        assert!(
            seen[1] > 0 && seen[2] > 0,
            "{name}: host and L3 hold prefixes: {seen:?}"
        );
        if host.is_some() {
            assert!(seen[0] > 0, "{name}: device copies stay: {seen:?}");
        }
    }
}
