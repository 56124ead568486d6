//! The same workloads through the direct core, the deterministic runtime and the actix
//! actor system give identical plans, step by step, and identical counters.

use kvtier_sim::tokens::gen_tokens;
use kvtier_sim::{
    Path, Report, StepDriver, WorkloadKind, WorkloadOptions, run_workload, scheduler_on,
};
use kvtier_types::{RequestSpec, SchedulerConfig, Token};

const PATHS: [Path; 4] = [
    Path::Core,
    Path::Deterministic,
    Path::Actors,
    Path::ActorsThreaded,
];

fn run(kind: WorkloadKind, path: Path, l2: bool, requests: Option<usize>) -> Report {
    let options = WorkloadOptions {
        l2,
        requests,
        path,
        record_plans: true,
        ..WorkloadOptions::new(kind)
    };
    run_workload(&options).unwrap_or_else(|e| panic!("{kind:?} on {path:?}: {e}"))
}

fn assert_same(kind: WorkloadKind, l2: bool, requests: Option<usize>) {
    let core = run(kind, Path::Core, l2, requests);
    assert!(core.plan_digests.len() > 10, "the run recorded its plans");
    for path in PATHS.into_iter().skip(1) {
        let other = run(kind, path, l2, requests);
        let first_diff = core
            .plan_digests
            .iter()
            .zip(&other.plan_digests)
            .position(|(a, b)| a != b);
        assert_eq!(
            first_diff, None,
            "{kind:?}: first differing plan on {path:?}"
        );
        assert_eq!(
            core.plan_digests.len(),
            other.plan_digests.len(),
            "{kind:?} on {path:?}"
        );
        assert_eq!(core.counters, other.counters, "{kind:?} on {path:?}");
    }
}

#[test]
fn w1_is_identical_on_every_runtime() {
    assert_same(WorkloadKind::W1, false, Some(400));
}

#[test]
fn w1_l2_is_identical_on_every_runtime() {
    assert_same(WorkloadKind::W1, true, Some(400));
}

#[test]
fn w2_is_identical_on_every_runtime() {
    assert_same(WorkloadKind::W2, false, Some(64));
}

#[test]
fn w3_is_identical_on_every_runtime() {
    assert_same(WorkloadKind::W3, false, None);
}

/// A seeded random workload under device pressure with a host tier: shared prefixes,
/// random prompt and output lengths, arrivals spread over steps, so admission,
/// chunking, eviction, write-back, load-back and retraction all happen.
fn random_run(seed: u64, path: Path) -> (Vec<u64>, kvtier_sim::Counters) {
    let config = SchedulerConfig {
        page_size: 4,
        device_pages: 96,
        host_pages: 160,
        max_batch_size: 12,
        max_scheduled_tokens: 96,
        enable_kv_cache_events: true,
        ..SchedulerConfig::default()
    };
    let mut driver = StepDriver::new(
        scheduler_on(path, config.clone()).expect("scheduler starts"),
        &config,
    );
    driver.plan_digests = Some(Vec::new());
    let mut rng = seed | 1;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let prefixes: Vec<Vec<Token>> = (0..4).map(|i| gen_tokens(seed * 10 + i, 40)).collect();
    let mut submitted = 0;
    for step in 0..400u64 {
        if submitted < 60 && next(3) == 0 {
            let mut batch = Vec::new();
            for _ in 0..=next(3) {
                let mut prompt = prefixes[next(4) as usize][..next(40) as usize].to_vec();
                prompt.extend(gen_tokens(seed << 20 | submitted, 1 + next(60) as usize));
                let output = gen_tokens(seed << 40 | submitted, 1 + next(30) as usize);
                batch.push((RequestSpec::new(format!("r{submitted:03}"), prompt), output));
                submitted += 1;
            }
            driver.submit(batch).expect("valid requests");
        }
        let out = driver.step().expect("step");
        if submitted >= 60 && driver.live() == 0 && out.empty {
            break;
        }
        assert!(step < 399, "the random workload drains");
    }
    (
        driver.plan_digests.take().unwrap_or_default(),
        driver.counters.clone(),
    )
}

#[test]
fn random_workloads_are_identical_on_every_runtime() {
    for seed in [1, 7, 42] {
        let runs: Vec<_> = PATHS.iter().map(|&p| random_run(seed, p)).collect();
        let (core_plans, core_counters) = &runs[0];
        assert!(core_counters.finished > 0, "seed {seed}: requests finished");
        let c = core_counters;
        assert!(
            c.retractions > 0 && c.loadback_ops > 0 && c.finish_writeback_ops > 0,
            "seed {seed}: the workload exercises retraction, load-back and write-back: {c:?}"
        );
        for (path, (plans, counters)) in PATHS.iter().zip(&runs).skip(1) {
            assert_eq!(plans, core_plans, "seed {seed}: plans on {path:?}");
            assert_eq!(counters, core_counters, "seed {seed}: counters on {path:?}");
        }
    }
}
