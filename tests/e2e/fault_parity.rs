//! The same fault gives the same errors on every runtime: each failed delivery of a
//! workload's messages (plans, advances, stats, KV events, shutdown) is injected under
//! actix, the deterministic bus and the direct path, and every call's answer, the stats
//! before it and the shutdown report after it must agree.

use kvtier::{ActorName, KvError, Runtime, ShutdownReport, System};
use kvtier_types::SchedulerConfig;

use crate::common::{Engine, FailNth, RUNTIMES, config, requests};

/// What a run answered: every call's result in order (plans by their digest), then the
/// shutdown report.
#[derive(Debug, PartialEq)]
struct Trace {
    answers: Vec<(&'static str, Result<String, KvError>)>,
    report: Result<ShutdownReport, KvError>,
}

fn run(runtime: Runtime, config: SchedulerConfig, message: &'static str, n: usize) -> Trace {
    let mut system = System::builder(config)
        .runtime(runtime)
        .fault_hooks(FailNth {
            message,
            n,
            seen: 0,
        })
        .start_local()
        .expect("starts");
    let mut answers = Vec::new();
    let mut engine = Engine::new(6);
    answers.push(("submit", system.submit(requests(8)).map(|()| String::new())));
    for _ in 0..40 {
        answers.push((
            "stats",
            system.stats().map(|s| format!("{:?}", s.scheduler)),
        ));
        answers.push((
            "take_kv_events",
            system.take_kv_events().map(|e| format!("{e:?}")),
        ));
        let plan = system.next_plan();
        let events = plan.as_ref().map(|p| engine.answer(p)).unwrap_or_default();
        answers.push(("next_plan", plan.map(|p| format!("{p:?}"))));
        answers.push(("advance", system.advance(events).map(|()| String::new())));
    }
    let report = system.shutdown();
    Trace { answers, report }
}

#[test]
fn every_runtime_answers_a_fault_alike() {
    let config = SchedulerConfig {
        enable_kv_cache_events: true,
        ..config()
    };
    let cases: [(&str, &[usize]); 12] = [
        ("RunBatch", &[1, 4, 17]),
        ("CacheReply", &[2, 9]),
        ("CacheStats", &[1, 5]),
        ("TreeStats", &[3]),
        ("HostStatsQuery", &[2, 41]),
        ("HostStats", &[6]),
        ("DrainKvEvents", &[1, 8]),
        ("KvEvents", &[4]),
        ("CheckPages", &[1]),
        ("Checked", &[1]),
        ("Stop", &[1]),
        ("Stopped", &[1]),
    ];
    let mut faults_seen = 0;
    for (message, ns) in cases {
        for &n in ns {
            let traces: Vec<Trace> = RUNTIMES
                .iter()
                .map(|&runtime| run(runtime, config.clone(), message, n))
                .collect();
            for (runtime, trace) in RUNTIMES.iter().zip(&traces).skip(1) {
                assert_eq!(
                    trace, &traces[0],
                    "{message} #{n}: {runtime:?} against {:?}",
                    RUNTIMES[0]
                );
            }
            let failed = traces[0]
                .answers
                .iter()
                .any(|(_, a)| matches!(a, Err(KvError::DeliveryFailed { .. })));
            let report = traces[0].report.as_ref().expect("shutdown is served");
            if failed || report.failure.is_some() {
                faults_seen += 1;
            }
            if message != "Stop" {
                // (A failed `Stop` leaves the cache, and its lease, alive: the report
                // says so.)
                assert_eq!(
                    report.host.leased_pages, 0,
                    "{message} #{n}: the lease came home"
                );
            }
        }
    }
    assert!(faults_seen >= 15, "the faults hit: {faults_seen}");
}

#[test]
fn a_fault_during_shutdown_is_reported_not_raised() {
    for runtime in RUNTIMES {
        let trace = run(runtime, config(), "CheckPages", 1);
        let report = trace.report.expect("shutdown answers");
        assert_eq!(
            report.conservation,
            Err(KvError::DeliveryFailed {
                to: ActorName::RADIX,
                message: "CheckPages"
            }),
            "{runtime:?}"
        );
    }
}
