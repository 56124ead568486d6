//! The embedding example runs to the end: every request finishes, the shared system
//! prompt is served from the cache, and shutdown finds nothing held.

#[allow(dead_code, reason = "the example's main is not called here")]
#[path = "../../examples/minimal_engine.rs"]
mod minimal_engine;

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
