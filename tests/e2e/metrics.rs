//! The Prometheus text of a system that ran is accepted by the real `promtool` (Debian's
//! `prometheus` package; `cargo xtask ci` unpacks it and sets `KVTIER_PROMTOOL`). Its
//! only complaints may be the colon-name lint that the `tokenspeed:` names trigger by
//! design (dashboards key on them); a malformed text is refused, so the check can fail.

use std::io::Write;
use std::process::{Command, Stdio};

use kvtier::Runtime;
use kvtier::metrics::prometheus_text;

use crate::common::{Engine, requests, start, tool_from_env};

/// `promtool check metrics` on `text`: its exit status and its complaints.
fn check(promtool: &str, text: &str) -> (bool, Vec<String>) {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write metrics");
    let out = child.wait_with_output().expect("promtool ends");
    let complaints = String::from_utf8_lossy(&out.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&out.stderr).lines())
        .map(str::to_owned)
        .filter(|l| !l.trim().is_empty())
        .collect();
    (out.status.success(), complaints)
}

#[test]
fn promtool_accepts_the_metrics_of_a_run() {
    let Some(promtool) = tool_from_env("KVTIER_PROMTOOL", "promtool") else {
        return;
    };
    let handle = start(Runtime::Direct);
    handle.submit(requests(6)).expect("submit");
    let mut engine = Engine::new(3);
    for _ in 0..40 {
        let plan = handle.next_plan().expect("plan");
        handle.advance(engine.answer(&plan)).expect("advance");
    }
    let stats = handle.stats().expect("stats");
    assert!(stats.scheduler.plans > 0);
    let text = prometheus_text(&stats);
    let (_, complaints) = check(&promtool, &text);
    let unexpected: Vec<&String> = complaints
        .iter()
        .filter(|c| {
            !(c.starts_with("tokenspeed:") && c.ends_with("metric names should not contain ':'"))
        })
        .collect();
    assert!(unexpected.is_empty(), "promtool: {unexpected:?}\n{text}");
    assert!(
        complaints.iter().any(|c| c.starts_with("tokenspeed:")),
        "the compatible names are linted, so promtool did read the text: {complaints:?}"
    );
    // A malformed exposition is refused.
    let (ok, complaints) = check(&promtool, "kvtier_plans_total{tier=} 1\n");
    assert!(!ok && !complaints.is_empty(), "{complaints:?}");
    handle.shutdown().expect("shutdown");
}

/// The Grafana dashboard (`docs/dashboards/kvtier.json`) queries only series kvtier
/// serves, and every query is PromQL the real `promtool` parses (as recording rules,
/// with the dashboard's variables filled in).
#[test]
fn the_grafana_dashboard_queries_what_kvtier_serves() {
    let Some(promtool) = tool_from_env("KVTIER_PROMTOOL", "promtool") else {
        return;
    };
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/dashboards/kvtier.json"
    );
    let dashboard: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).expect("the dashboard")).expect("JSON");
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|panel| panel["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|target| target["expr"].as_str().map(str::to_owned))
        .collect();
    assert!(exprs.len() >= 10, "{exprs:?}");
    // Every family a fully equipped system has: device, L3, both hybrid families.
    let mut stats = kvtier::SystemStats {
        device: Some(Default::default()),
        l3: Some(Default::default()),
        ..Default::default()
    };
    stats.scheduler.states = Some(Default::default());
    stats.scheduler.groups = Some(Box::new(kvtier_paged::PagedReport {
        groups: vec![kvtier_paged::GroupStats {
            id: "window".into(),
            ..Default::default()
        }],
        ..Default::default()
    }));
    let served: Vec<&str> = kvtier::metrics::series(&stats)
        .iter()
        .map(|s| s.name)
        .collect();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, expr) in exprs.iter().enumerate() {
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')) {
            if !(word.starts_with("kvtier_") || word.starts_with("tokenspeed:")) {
                continue;
            }
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| word.strip_suffix(suffix))
                .filter(|base| served.contains(base))
                .unwrap_or(word);
            assert!(served.contains(&family), "{word} in {expr} is not served");
        }
        let filled = expr.replace("$__rate_interval", "5m").replace("$job", ".*");
        let quoted = serde_json::to_string(&filled).expect("a string");
        rules.push_str(&format!(
            "      - record: dashboard:panel_{i}\n        expr: {quoted}\n"
        ));
    }
    let dir = tempfile::tempdir().expect("a scratch directory");
    let file = dir.path().join("dashboard.rules.yml");
    std::fs::write(&file, &rules).expect("write the rules");
    let out = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect("promtool runs");
    assert!(
        out.status.success(),
        "promtool: {}{}\n{rules}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
