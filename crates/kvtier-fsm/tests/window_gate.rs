//! The mid-flight publication gate of reference 004 (PR381) for plain sliding-window
//! models: a sibling reuses at most the first `floor(W / P)` pages of a running
//! request's prefix, published at the transition to decode and at decode page
//! crossings; a model flagged unsafe (W = 0) publishes nothing mid-flight. The config
//! comes from `kvtier_paged::MidflightGate`, as a model preset derives it.

mod common;

use common::*;
use kvtier_paged::{CacheShape, MidflightGate};
use kvtier_types::SchedulerConfig;

/// PR381's plain-SWA fixture: P = 1, 64 device and host pages, a 64-token budget,
/// batch 8, four decode tokens, no paged groups.
fn plain_swa(window: u32) -> SchedulerConfig {
    let gate = MidflightGate::for_shape(CacheShape::PlainWindow { window }, 1);
    SchedulerConfig {
        page_size: 1,
        device_pages: 64,
        host_pages: 64,
        max_scheduled_tokens: 64,
        max_batch_size: 8,
        decode_input_tokens: 4,
        publish_prefix_mid_flight: gate.enabled,
        midflight_publish_max_pages: gate.max_pages,
        ..SchedulerConfig::default()
    }
}

/// r1 = 1..=8 runs its prefill and starts decoding; a sibling with the same prompt
/// arrives.
fn sibling_after_transition(config: SchedulerConfig) -> u32 {
    let mut s = sched(config);
    submit(&mut s, "r1", tokens(1, 8));
    let plan = s.next_plan();
    assert_eq!(row_of(&plan, "r1").input_length, 8);
    advance(&mut s, vec![extend("r1", &[100])]);
    let plan = s.next_plan(); // PrefillDone → Decoding: the publication point
    assert!(row(&plan, "r1").is_some());
    submit(&mut s, "hit4", tokens(1, 8));
    let plan = s.next_plan();
    check(&mut s);
    row_of(&plan, "hit4").extend_prefix_len
}

#[test]
fn midflight_publish_is_capped_to_sliding_window() {
    assert_eq!(sibling_after_transition(plain_swa(4)), 4);
    // Without a window the whole prefix but its last token is reused.
    let no_window = SchedulerConfig {
        midflight_publish_max_pages: None,
        ..plain_swa(4)
    };
    assert_eq!(sibling_after_transition(no_window), 7);
}

/// r1 = {1, 2} decodes {3, 4, 5, 6} in one step: the decode result crosses pages and
/// publishes, up to the window.
fn sibling_after_decode_result(config: SchedulerConfig) -> u32 {
    let mut s = sched(config);
    submit(&mut s, "r1", vec![1, 2]);
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[3])]);
    s.next_plan();
    advance(&mut s, vec![extend("r1", &[4, 5, 6])]);
    submit(&mut s, "hit4", tokens(1, 6));
    let plan = s.next_plan();
    check(&mut s);
    row_of(&plan, "hit4").extend_prefix_len
}

#[test]
fn decode_result_publishes_window_capped_prefix() {
    assert_eq!(sibling_after_decode_result(plain_swa(4)), 4);
}

#[test]
fn midflight_publish_is_disabled_without_safe_window() {
    assert_eq!(
        MidflightGate::for_shape(CacheShape::PlainWindow { window: 0 }, 1),
        MidflightGate::OFF
    );
    assert_eq!(sibling_after_transition(plain_swa(0)), 0);
    assert_eq!(sibling_after_decode_result(plain_swa(0)), 0);
}
