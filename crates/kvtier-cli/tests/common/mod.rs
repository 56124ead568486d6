//! What the `kvtier` binary's tests share: where the binary and the repository are,
//! and a replay of the conversation trace that answers its JSON report.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

pub const KVTIER: &str = env!("CARGO_BIN_EXE_kvtier");

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `kvtier replay` of the conversation trace with `args`, its JSON report written to
/// `dir/name.json` and read back (no exporter from the caller's environment).
pub fn replay_report(args: &[&str], dir: &Path, name: &str) -> Value {
    let report = dir.join(format!("{name}.json"));
    let status = Command::new(KVTIER)
        .current_dir(repo())
        .args([
            "replay",
            "--trace",
            "data/mooncake-traces/conversation_trace.jsonl",
        ])
        .args(args)
        .arg("--json")
        .arg(&report)
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdout(Stdio::null())
        .status()
        .expect("kvtier runs");
    assert!(status.success(), "kvtier replay {args:?} failed");
    serde_json::from_slice(&std::fs::read(&report).expect("the report")).expect("JSON")
}
