//! The `longdoc` scenario with a real Mooncake cluster as the L3 store (`cargo xtask
//! mooncake up`; `cargo xtask ci` starts one): documents come back from Mooncake with the
//! answers of a run without cache, and a master killed mid-run turns the rest of the run
//! into misses, never wrong KV. Without a cluster these tests say so loudly and skip;
//! under CI (`CI=true`) they fail instead.

use kvtier_l3::MooncakeConfig;
use kvtier_sim::scenario::{
    L3Store, Scenario, ScenarioOptions, ScenarioReport, run_scenario, run_scenario_with,
};

/// The cluster the environment describes, or a loud skip (a failure under CI).
fn cluster() -> Option<MooncakeConfig> {
    let config = MooncakeConfig::from_env();
    if config.is_none() {
        let msg = "Mooncake is not set up (MOONCAKE_STORE_LIBRARY unset): run `cargo xtask \
                   mooncake up` and `eval $(cargo xtask mooncake env)`";
        assert!(std::env::var("CI").map_or(true, |v| v != "true"), "{msg}");
        eprintln!("SKIPPED: {msg}");
    }
    config
}

/// A model id no earlier run used: the master keeps objects between runs.
fn fresh_model(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("longdoc-{test}-{}-{nanos}", std::process::id())
}

fn mooncake_options(test: &str, cluster: MooncakeConfig) -> ScenarioOptions {
    ScenarioOptions {
        l3: L3Store::Mooncake,
        l3_model: fresh_model(test),
        mooncake: Some(cluster),
        ..ScenarioOptions::new(Scenario::Longdoc)
    }
}

fn checked(r: ScenarioReport) -> ScenarioReport {
    assert_eq!(r.integrity_errors, 0, "{:?}", r.first_errors);
    assert_eq!(r.finished, r.requests, "every question is answered");
    r
}

fn cache_off() -> ScenarioReport {
    checked(
        run_scenario(&ScenarioOptions {
            cache: false,
            ..ScenarioOptions::new(Scenario::Longdoc)
        })
        .expect("longdoc runs without cache"),
    )
}

#[test]
fn documents_come_back_from_mooncake_with_the_answers_of_a_run_without_cache() {
    let Some(cluster) = cluster() else { return };
    let off = cache_off();
    let on = checked(run_scenario(&mooncake_options("roundtrip", cluster)).expect("longdoc runs"));
    assert_eq!(on.l3, "mooncake");
    assert_eq!(
        on.outputs, off.outputs,
        "answers differ from the cache-off run"
    );
    // As with the local store: every question after the first of its document finds the
    // whole document in L3 only.
    assert_eq!(on.l3_prefetch_ops, 8, "{on:#?}");
    assert_eq!(on.l3_prefetched_pages, 8 * 2048);
    assert_eq!(on.hit_tokens_l3, 8 * 32_768);
    assert_eq!(on.l3_failed_prefetches, 0);
    assert!(on.l3_backed_up_pages >= 4 * 2048);
    assert_eq!(on.l3_backed_up_bytes, on.l3_backed_up_pages * 512);
}

/// A `mooncake_master` of this test's own, on its own loopback ports, killed on drop.
struct OwnMaster(std::process::Child);

impl Drop for OwnMaster {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const OWN_RPC_PORT: u16 = 50072;
const OWN_METADATA_PORT: u16 = 8092;

fn start_own_master(library: &std::path::Path) -> OwnMaster {
    let child = std::process::Command::new(library.with_file_name("mooncake_master"))
        .args([
            "--rpc_address=127.0.0.1".to_string(),
            format!("--rpc_port={OWN_RPC_PORT}"),
            "--enable_http_metadata_server=true".to_string(),
            "--http_metadata_server_host=127.0.0.1".to_string(),
            format!("--http_metadata_server_port={OWN_METADATA_PORT}"),
            "--metrics_host=127.0.0.1".to_string(),
            "--metrics_port=9014".to_string(),
        ])
        .env("MC_TCP_BIND_ADDRESS", "127.0.0.1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the test's own mooncake_master");
    let master = OwnMaster(child);
    let ready = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        std::net::TcpStream::connect(("127.0.0.1", OWN_RPC_PORT)).is_ok()
            && std::net::TcpStream::connect(("127.0.0.1", OWN_METADATA_PORT)).is_ok()
    });
    assert!(ready, "the test's own master did not start");
    master
}

/// The master dies once the first two documents have come back from it: later lookups,
/// prefetches and backups fail, those documents are recomputed, answers stay right.
#[test]
fn killing_the_master_mid_run_turns_the_rest_into_misses() {
    let Some(cluster) = cluster() else { return };
    let off = cache_off();
    let mut master = Some(start_own_master(&cluster.library));
    let cluster = MooncakeConfig {
        master: format!("127.0.0.1:{OWN_RPC_PORT}"),
        metadata: format!("http://127.0.0.1:{OWN_METADATA_PORT}/metadata"),
        ..cluster
    };
    let options = mooncake_options("killed", cluster);
    // Questions are answered one at a time: d0q0, d1q0, d2q0, d3q0, d0q1, d1q1, ...
    // Kill the master as soon as six are answered (two of them prefetched from it),
    // before the seventh is submitted.
    let r = run_scenario_with(
        &options,
        |answered, _| {
            if answered >= 6 {
                master.take();
            }
        },
        |_| {},
    )
    .expect("a dead L3 store never stops the run");
    assert!(master.is_none(), "the master was killed mid-run");
    let r = checked(r);
    assert_eq!(
        r.outputs, off.outputs,
        "answers differ from the cache-off run"
    );
    assert_eq!(
        r.hit_tokens_l3,
        2 * 32_768,
        "the two documents prefetched before the kill, and none after: {r:#?}"
    );
}
