//! `kvtier replay --instances N --processes`: each instance in a process of its own (the
//! binary again, driven over its stdin and stdout), its KV events reaching the router
//! over ZeroMQ. The run is the in-process cluster's, decision for decision; against a
//! real Mooncake master (`cargo xtask ci` provides one) the processes share one L3 and
//! read each other's pages, checked by their integrity oracles.

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

mod common;

use common::{KVTIER, replay_report, repo};

/// `kvtier replay --instances 3` of the conversation trace's first 150 requests, with
/// `extra` flags; its JSON report.
fn cluster(extra: &[&str], dir: &Path, name: &str) -> Value {
    let sizes = ["--device-pages", "2049", "--host-pages", "4097"];
    let cluster = ["--limit", "150", "--instances", "3", "--router", "prefix"];
    replay_report(&[&cluster[..], &sizes, extra].concat(), dir, name)
}

/// What the two ways of running must agree on (not wall-clock timings).
fn decisions(r: &Value) -> Value {
    let router = &r["router"];
    serde_json::json!({
        "hit_tokens": r["hit_tokens"],
        "hit_tokens_l3": r["hit_tokens_l3"],
        "ttft_p90_ms": r["ttft_p90_ms"],
        "routed": router["routed"],
        "overestimated": router["overestimated"],
        "digests": r["per_instance"].as_array().map(|a| a.iter().map(|i| i["output_digest"].clone()).collect::<Vec<_>>()),
    })
}

#[test]
fn instances_in_processes_of_their_own_replay_as_in_one() {
    let dir = tempfile::tempdir().expect("a scratch directory");
    let one = cluster(&["--l3-scope", "private"], dir.path(), "one");
    let many = cluster(
        &["--l3-scope", "private", "--processes"],
        dir.path(),
        "many",
    );
    assert_eq!(decisions(&one), decisions(&many));
    assert_eq!(many["integrity_errors"], 0);
    assert!(many["router"]["events"].as_u64() > Some(0), "{many:#}");
    // The embedded store lives in one process: processes cannot share it.
    let status = Command::new(KVTIER)
        .current_dir(repo())
        .args([
            "replay",
            "--limit",
            "10",
            "--instances",
            "2",
            "--processes",
            "--l3-scope",
            "shared",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("kvtier runs");
    assert!(!status.success());
}

#[test]
fn processes_share_one_mooncake_master() {
    // The cluster `cargo xtask mooncake run` describes (the processes find it in their
    // environment), or a loud skip (a failure under CI).
    if kvtier_l3::testing::cluster_from_env()
        .expect("a Mooncake cluster under CI")
        .is_none()
    {
        return;
    }
    let dir = tempfile::tempdir().expect("a scratch directory");
    let r = cluster(&["--l3", "mooncake", "--processes"], dir.path(), "mooncake");
    assert_eq!(r["l3"], "shared mooncake");
    assert_eq!(r["integrity_errors"], 0, "{r:#}");
    let n = |k: &str| r[k].as_u64().unwrap_or_default();
    assert_eq!(
        n("finished") + n("aborted") + n("refused"),
        n("requests"),
        "{r:#}"
    );
    let read = r["l3_prefetched_bytes"].as_array().expect("per instance");
    assert!(
        read.iter().filter(|b| b.as_u64() > Some(0)).count() >= 2,
        "{read:?}"
    );
}
