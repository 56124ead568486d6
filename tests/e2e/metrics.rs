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
