//! Mooncake request traces: the reader (bad input named by line and field), the slice
//! selectors, the tokens a replay makes, the unbounded-cache bound on a hand-made trace,
//! and a replay whose capacity holds everything reaching that bound exactly.

use kvtier_sim::oracle::Verify;
use kvtier_sim::scenario::{L3Store, ScenarioOptions, TraceWorkload, run_scenario};
use kvtier_sim::trace::{
    BLOCK_TOKENS, TraceError, TraceRequest, TraceSlice, parse_trace, read_trace,
    unbounded_hit_tokens,
};

fn line(ts: u64, input: u32, output: u32, ids: &[u64]) -> String {
    format!(
        "{{\"timestamp\": {ts}, \"input_length\": {input}, \"output_length\": {output}, \"hash_ids\": {ids:?}}}"
    )
}

fn parse(text: &str) -> Result<Vec<TraceRequest>, TraceError> {
    parse_trace(text, &TraceSlice::default())
}

fn line_error(text: &str) -> (usize, Option<&'static str>, String) {
    match parse(text) {
        Err(TraceError::Line {
            line,
            field,
            problem,
        }) => (line, field, problem),
        other => panic!("a line error expected, got {other:?}"),
    }
}

#[test]
fn a_trace_line_reads_into_a_request() {
    let text = format!(
        "{}\n\n{}\n",
        line(0, 600, 5, &[1, 2]),
        line(7, 512, 0, &[1])
    );
    let requests = parse(&text).expect("valid");
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[0],
        TraceRequest {
            line: 1,
            timestamp_ms: 0,
            input_length: 600,
            output_length: 5,
            hash_ids: vec![1, 2],
        }
    );
    assert_eq!(requests[1].line, 3, "blank lines keep their numbers");
}

#[test]
fn bad_lines_are_named_by_line_and_field() {
    let good = line(0, 10, 1, &[1]);
    let cases: Vec<(String, Option<&str>, &str)> = vec![
        ("not json".into(), None, "not JSON"),
        ("[1, 2]".into(), None, "not a JSON object"),
        (
            "{\"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}".into(),
            Some("timestamp"),
            "`timestamp` is missing",
        ),
        (
            "{\"timestamp\": -4, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}"
                .into(),
            Some("timestamp"),
            "not a non-negative integer",
        ),
        (line(9, 0, 1, &[]), Some("input_length"), "is 0"),
        (
            "{\"timestamp\": 9, \"input_length\": 10, \"output_length\": \"many\", \"hash_ids\": [1]}"
                .into(),
            Some("output_length"),
            "not a non-negative integer",
        ),
        (line(9, 600, 1, &[1]), Some("hash_ids"), "1 ids for 600 tokens"),
        (
            "{\"timestamp\": 9, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [\"a\"]}"
                .into(),
            Some("hash_ids"),
            "not an id",
        ),
    ];
    for (bad, field, words) in cases {
        let (at, got_field, problem) = line_error(&format!("{good}\n{bad}"));
        assert_eq!(at, 2, "{bad}");
        assert_eq!(got_field, field, "{bad}");
        assert!(problem.contains(words), "{bad}: {problem}");
    }
    // Arrivals out of order.
    let (at, field, _) = line_error(&format!(
        "{}\n{}",
        line(50, 10, 1, &[1]),
        line(20, 10, 1, &[1])
    ));
    assert_eq!((at, field), (2, Some("timestamp")));
}

#[test]
fn windows_and_limits_select_a_slice() {
    let text: String = (0..10)
        .map(|i| line(i * 1000, 10, 1, &[i]) + "\n")
        .collect();
    let slice = TraceSlice {
        window_ms: Some(TraceSlice::parse_window("2..6").expect("valid")),
        limit: Some(3),
    };
    let picked = parse_trace(&text, &slice).expect("valid");
    let seconds: Vec<u64> = picked.iter().map(|r| r.timestamp_ms / 1000).collect();
    assert_eq!(seconds, [2, 3, 4]);
    assert_eq!(TraceSlice::parse_window("..1.5").expect("valid"), 0..1500);
    for bad in ["5..2", "a..b", "7", "-1..3"] {
        assert!(
            matches!(TraceSlice::parse_window(bad), Err(TraceError::Slice(_))),
            "{bad}"
        );
    }
    let none = TraceSlice {
        window_ms: Some(100_000..200_000),
        limit: None,
    };
    assert!(matches!(parse_trace(&text, &none), Err(TraceError::Empty)));
    assert!(matches!(
        read_trace(
            std::path::Path::new("/nonexistent/trace.jsonl"),
            &TraceSlice::default()
        ),
        Err(TraceError::Io { .. })
    ));
}

/// Equal ids give equal tokens; a partial last block is a prefix of the full one;
/// different ids differ.
#[test]
fn the_tokens_of_a_block_depend_on_its_id_and_position_only() {
    let requests = parse(&format!(
        "{}\n{}\n{}",
        line(0, 1024, 1, &[7, 8]),
        line(1, 700, 1, &[7, 8]),
        line(2, 1024, 1, &[7, 9]),
    ))
    .expect("valid");
    let (a, b, c) = (
        requests[0].prompt(),
        requests[1].prompt(),
        requests[2].prompt(),
    );
    assert_eq!((a.len(), b.len()), (1024, 700));
    assert_eq!(&a[..700], &b[..]);
    assert_eq!(a[..BLOCK_TOKENS], c[..BLOCK_TOKENS]);
    assert_ne!(a[BLOCK_TOKENS..], c[BLOCK_TOKENS..]);
    assert!(a.iter().all(|&t| (1..=32_000).contains(&t)));
}

/// A hand-made trace: the bound counts, per request, the whole pages of its prompt
/// (never the last token) that an earlier prompt had.
#[test]
fn the_unbounded_bound_of_a_hand_made_trace() {
    let requests = parse(&format!(
        "{}\n{}\n{}\n{}",
        line(0, 1000, 1, &[1, 2]),    // nothing before it
        line(1, 1100, 1, &[1, 2, 3]), // blocks 1, 2 whole: 1000 tokens, 62 pages of 16
        line(2, 300, 1, &[1]),        // 299 reusable tokens: 18 pages
        line(3, 512, 1, &[4]),        // new
    ))
    .expect("valid");
    // Block 2 of the first request is partial (488 tokens): pages ending past 1000
    // were never seen.
    assert_eq!(unbounded_hit_tokens(&requests, 16), (62 + 18) * 16);
}

/// Requests far apart on the clock, a cache that holds everything: kvtier's hits are
/// exactly the unbounded cache's, and the answers are those of a run without cache.
#[test]
fn with_room_for_everything_the_replay_reaches_the_unbounded_bound() {
    let requests = parse(&format!(
        "{}\n{}\n{}\n{}\n{}",
        line(0, 1500, 4, &[1, 2, 3]),
        line(60_000, 1800, 4, &[1, 2, 3, 4]),
        line(120_000, 700, 4, &[1, 5]),
        line(180_000, 1800, 4, &[1, 2, 3, 6]),
        line(240_000, 520, 3, &[7, 8]),
    ))
    .expect("valid");
    let bound = unbounded_hit_tokens(&requests, 16);
    assert!(bound > 0);
    let workload = |requests: Vec<TraceRequest>| TraceWorkload {
        name: "hand-made".into(),
        requests,
        time_scale: 1.0,
    };
    let run = |cache: bool, l3: L3Store| {
        let options = ScenarioOptions {
            cache,
            l3,
            verify: Verify::Full,
            ..ScenarioOptions::trace(workload(requests.clone()))
        };
        run_scenario(&options).expect("replay runs")
    };
    let off = run(false, L3Store::Off);
    // The run's metrics text, as a `/metrics` endpoint would serve it, says the same.
    let metrics = kvtier_sim::scenario::MetricsSink::default();
    let on = run_scenario(&ScenarioOptions {
        metrics: Some(metrics.clone()),
        ..ScenarioOptions::trace(workload(requests.clone()))
    })
    .expect("replay runs");
    let text = metrics.text.lock().expect("metrics").clone();
    assert!(
        text.contains(&format!(
            "tokenspeed:prefix_cache_hits_total {}\n",
            on.hit_tokens
        )),
        "{text}"
    );
    assert!(text.contains(&format!(
        "tokenspeed:prefix_cache_queries_total {}\n",
        on.prompt_tokens
    )));
    for l3 in [L3Store::Off, L3Store::Local] {
        let on = run(true, l3);
        assert_eq!(on.unbounded_hit_tokens, bound);
        assert_eq!(on.hit_tokens, bound, "{l3:?}");
        assert_eq!(on.ideal_hit_tokens, bound, "{l3:?}");
        assert_eq!(
            on.scheduler_hit_tokens,
            [on.hit_tokens, on.hit_tokens_host, on.hit_tokens_l3],
            "{l3:?}: the scheduler's counters are the replay's"
        );
        assert_eq!(on.integrity_errors, 0, "{:?}", on.first_errors);
        assert_eq!(on.outputs, off.outputs, "{l3:?}: answers");
        assert_eq!(on.finished, 5);
    }
}

/// A sweep runs every point of its grid; the points do not depend on how many run at
/// once; none beats the unbounded cache; the plot has one line per host and L3 setting.
#[test]
fn a_sweep_is_the_same_on_one_worker_or_two_and_draws_every_series() {
    use kvtier_sim::sweep::{SweepOptions, run_sweep};
    let requests = parse(&format!(
        "{}\n{}\n{}\n{}",
        line(0, 1100, 2, &[1, 2, 3]),
        line(30_000, 1100, 2, &[1, 2, 4]),
        line(60_000, 600, 2, &[5, 6]),
        line(90_000, 1100, 2, &[1, 2, 3]),
    ))
    .expect("valid");
    let options = |jobs| SweepOptions {
        trace: std::sync::Arc::new(TraceWorkload {
            name: "hand-made".into(),
            requests: requests.clone(),
            time_scale: 1.0,
        }),
        device_tokens: vec![1024, 8192],
        host_tokens: vec![16, 8192],
        l3: vec![L3Store::Off, L3Store::Local],
        jobs,
    };
    let one = run_sweep(&options(1), |_, _| {}).expect("sweep runs");
    let two = run_sweep(&options(2), |_, _| {}).expect("sweep runs");
    assert_eq!(one, two);
    assert_eq!(one.points.len(), 8);
    for p in &one.points {
        assert!(p.hit_tokens <= one.unbounded_hit_tokens, "{p:?}");
        assert!(p.hit_tokens_l3 <= p.hit_tokens_host && p.hit_tokens_host <= p.hit_tokens);
    }
    // With room on device, the repeated prompt hits its whole reusable prefix.
    let roomy = one
        .points
        .iter()
        .find(|p| p.device_tokens == 8192 && p.host_tokens == 8192 && p.l3 == "off")
        .expect("that point");
    assert_eq!(roomy.hit_tokens, one.unbounded_hit_tokens);
    let svg = one.svg();
    assert_eq!(
        svg.matches("<polyline").count(),
        4,
        "one line per host and L3 setting"
    );
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("unbounded cache"));
}

/// A watched replay says why hits were lost (the cache remembers the pages it dropped):
/// over the conversation trace's first 200 requests without L3, some of what was cached
/// is evicted and asked for again; what was reused plus what was lost is exactly what
/// the engine had computed before (the ideal: it can only be more where a prefix was
/// being computed by a running request, or dropped longer ago than the cache
/// remembers); and watching changes no decision. A hybrid model adds the prefix the tree
/// holds past its last cached state.
#[test]
fn a_watched_replay_counts_its_lost_hits() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../data/mooncake-traces/conversation_trace.jsonl"
    );
    let slice = TraceSlice {
        limit: Some(200),
        ..TraceSlice::default()
    };
    let requests = read_trace(std::path::Path::new(path), &slice).expect("the trace");
    let options = ScenarioOptions {
        l3: L3Store::Off,
        ..ScenarioOptions::trace(TraceWorkload {
            name: "conversation".into(),
            requests,
            time_scale: 1.0,
        })
    };
    let plain = run_scenario(&options).expect("replay runs");
    assert!(!plain.lost_hits_tracked);
    let watched = run_scenario(&ScenarioOptions {
        metrics: Some(kvtier_sim::scenario::MetricsSink::default()),
        ..options.clone()
    })
    .expect("replay runs");
    assert!(watched.lost_hits_tracked);
    assert_eq!(watched.output_digest, plain.output_digest);
    assert_eq!(watched.steps, plain.steps);
    assert_eq!(watched.hit_tokens, plain.hit_tokens);
    let [not_reused, l3, prefetched, evicted] = watched.lost_hit_tokens;
    assert!(evicted > 0, "{:?}", watched.lost_hit_tokens);
    assert_eq!(
        (not_reused, l3, prefetched),
        (0, 0, 0),
        "no L3, a dense model"
    );
    assert_eq!(watched.hit_tokens + evicted, watched.ideal_hit_tokens);

    // A hybrid model also loses what the tree holds past its last cached state.
    let hybrid = run_scenario(&ScenarioOptions {
        model: kvtier_model::ModelKind::MambaHybrid,
        metrics: Some(kvtier_sim::scenario::MetricsSink::default()),
        ..options
    })
    .expect("replay runs");
    let [capped, l3, prefetched, evicted] = hybrid.lost_hit_tokens;
    assert!(
        capped > 0 && l3 + prefetched == 0,
        "{:?}",
        hybrid.lost_hit_tokens
    );
    assert_eq!(
        hybrid.hit_tokens + evicted + capped,
        hybrid.ideal_hit_tokens
    );
}
