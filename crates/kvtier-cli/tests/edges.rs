//! The `kvtier` binary at the edges of its input: each bad value is refused with exit
//! code 1 and a message naming the flag, before the run announces anything.

use std::process::{Command, Output};

mod common;

use common::{KVTIER, repo};

/// The binary run as on a Rust developer's machine, where backtraces are on.
fn kvtier(args: &[&str]) -> Output {
    Command::new(KVTIER)
        .current_dir(repo())
        .args(args)
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("kvtier runs")
}

/// `args` fail with exit code 1, and stderr says `message` in one line, without a
/// backtrace, and nothing announced a run.
fn refused(args: &[&str], message: &str) {
    let out = kvtier(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(stderr.contains(message), "{args:?}: {stderr}");
    assert!(
        !stderr.contains("replaying"),
        "{args:?} announced a run: {stderr}"
    );
    assert!(
        stderr.trim().lines().count() == 1 && !stderr.contains("backtrace"),
        "{args:?}: a user's error is one line, without a backtrace: {stderr}"
    );
}

#[test]
fn a_limit_of_zero_is_refused() {
    refused(&["replay", "--limit", "0"], "--limit 0 replays nothing");
}

#[test]
fn zero_instances_are_refused_before_anything_is_announced() {
    refused(
        &["replay", "--instances", "0"],
        "--instances 0 has nowhere to replay",
    );
}

#[test]
fn a_negative_time_scale_gets_the_real_message_in_either_spelling() {
    for args in [
        &["replay", "--time-scale", "-1"][..],
        &["replay", "--time-scale=-1"][..],
    ] {
        refused(args, "--time-scale must be a positive number, not -1");
    }
}

#[test]
fn a_host_pool_without_pages_names_the_flags_to_use() {
    refused(
        &["replay", "--host-pages", "0"],
        "--host-pages 0 leaves no host pool (page 0 is reserved): give at least 2, or run without the host tier with --no-cache",
    );
}

#[test]
fn kv_events_on_a_host_name_say_to_give_an_address() {
    refused(
        &["replay", "--kv-events", "tcp://localhost:5555"],
        "ZeroMQ binds addresses, not host names",
    );
}

#[test]
fn an_otlp_endpoint_it_cannot_use_is_refused_before_the_export_is_announced() {
    let out = kvtier(&["replay", "--otlp-endpoint", "https://127.0.0.1:4318"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is not an http:// URL"), "{stderr}");
    assert!(!stderr.contains("exporting"), "announced first: {stderr}");
}

/// What `replay --help` says the L3 default is, a replay does.
#[test]
fn the_l3_default_help_states_is_the_one_a_replay_uses() {
    let help = kvtier(&["replay", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("default: `local` for traces"), "{help}");
    let dir = tempfile::tempdir().expect("a scratch directory");
    let report = dir.path().join("r.json");
    let report_arg = report.to_string_lossy().into_owned();
    let out = kvtier(&["replay", "--limit", "1", "--json", &report_arg]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).expect("the report")).expect("JSON");
    assert_eq!(json["l3"], "local");
}

/// A sweep writes its plot where `--svg` says, and nowhere without it (not into the
/// working directory).
#[test]
fn a_sweep_writes_a_plot_only_where_asked() {
    let dir = tempfile::tempdir().expect("a scratch directory");
    let sweep = |extra: &[&str]| {
        let out = Command::new(KVTIER)
            .current_dir(dir.path())
            .args(["sweep", "--limit", "3", "--device-tokens", "16384"])
            .args(["--host-tokens", "65536", "--l3", "off"])
            .args(extra)
            .output()
            .expect("kvtier runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    sweep(&[]);
    let written: Vec<_> = std::fs::read_dir(dir.path()).expect("readable").collect();
    assert!(written.is_empty(), "wrote {written:?} unasked");
    let plot = dir.path().join("plot.svg");
    sweep(&["--svg", &plot.to_string_lossy()]);
    let svg = std::fs::read_to_string(&plot).expect("the plot");
    assert!(svg.contains("<svg"), "{svg:.80}");
}
