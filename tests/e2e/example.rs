//! The embedding example runs to the end: every request finishes, the shared system
//! prompt is served from the cache, and shutdown finds nothing held.

#[allow(dead_code, reason = "the example's main is not called here")]
#[path = "../../examples/minimal_engine.rs"]
mod minimal_engine;

#[allow(dead_code, reason = "the example's main is not called here")]
#[path = "../../examples/observed_engine.rs"]
mod observed_engine;

#[test]
fn the_minimal_engine_example_runs() {
    let summary = minimal_engine::run().expect("the example runs");
    assert_eq!(summary.finished, 4);
    assert_eq!(summary.aborted, 0);
    assert!(summary.steps >= 2, "the loop ran");
    assert!(summary.stats.scheduler.idle, "nothing left in flight");
    assert!(
        summary.cached_tokens > 0,
        "the shared system prompt was reused"
    );
    assert!(summary.report.is_clean(), "{:?}", summary.report);
    assert!(
        summary.stats.scheduler.cached_host_pages > 0,
        "finished requests were written back"
    );
}

/// The observed example serves its metrics and publishes every tier's KV events while
/// it runs (no OTLP here: the export installs the process's global subscriber, which
/// `tracing_context` owns in this binary).
#[test]
fn the_observed_engine_example_serves_metrics_and_events() {
    let observed = observed_engine::run(false).expect("the example runs");
    assert_eq!(observed.finished, 4);
    assert!(!observed.exported);
    let queries = observed
        .metrics
        .lines()
        .find_map(|l| l.strip_prefix("tokenspeed:prefix_cache_queries_total "))
        .and_then(|v| v.parse::<u64>().ok())
        .expect("the queries counter");
    assert_eq!(queries, 4 * 69, "four prompts of 69 tokens");
    let hits = observed
        .metrics
        .lines()
        .find_map(|l| l.strip_prefix("tokenspeed:prefix_cache_hits_total "))
        .and_then(|v| v.parse::<u64>().ok());
    assert!(hits > Some(0), "the system prompt was reused: {hits:?}");
    assert!(
        observed
            .metrics
            .contains("kvtier_step_duration_seconds_count")
    );
    assert!(observed.kv_events > 0, "the cache published its pages");
    assert!(observed.kv_endpoint.starts_with("tcp://127.0.0.1:"));
}
