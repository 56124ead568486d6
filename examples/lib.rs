//! Examples of embedding kvtier, one file each beside this one; `cargo xtask ci` runs
//! every one (`cargo run -p kvtier-examples --example NAME`).
//!
//! The library holds what they share: the requests ([`users_sharing_a_system_prompt`])
//! and the made-up engine step ([`run_plan`]).

use std::collections::BTreeMap;

use kvtier_types::{EngineEvent, ExecutionPlan, RequestSpec, engine_rule};

/// Tokens each request generates before the made-up engine finishes it.
pub const TOKENS_PER_ANSWER: usize = 8;

/// The made-up engine's side of one step, the events for `advance`: every write-back
/// copy reported done, one made-up token per row that yields one, a finish after
/// [`TOKENS_PER_ANSWER`]. A real engine would run the copies and the forward rows on the
/// GPU instead.
pub fn run_plan(plan: &ExecutionPlan, produced: &mut BTreeMap<String, usize>) -> Vec<EngineEvent> {
    let mut events = Vec::new();
    // Copies: a real engine moves these pages between GPU and host memory first.
    for op in &plan.write_backs {
        events.push(EngineEvent::WriteBackDone {
            op_id: op.op_id,
            success: true,
        });
    }
    for row in &plan.forward.rows {
        // A prefill row samples a token only when its chunk completes the prompt; a
        // decode row always does.
        if !engine_rule::yields_token(row) {
            continue;
        }
        let n = produced.entry(row.request_id.to_string()).or_default();
        *n += 1;
        events.push(EngineEvent::ExtendResult {
            request_id: row.request_id.clone(),
            tokens: vec![42],
        });
        // A real engine stops on its own criteria (end of sequence, max tokens).
        if *n == TOKENS_PER_ANSWER {
            events.push(EngineEvent::Finish {
                request_id: row.request_id.clone(),
            });
        }
    }
    events
}

/// Four users' prompts: the same 64-token system prompt, then 5 tokens of each user's.
pub fn users_sharing_a_system_prompt() -> Vec<RequestSpec> {
    let system_prompt: Vec<i32> = (1..=64).collect();
    (0..4)
        .map(|i| {
            let mut prompt = system_prompt.clone();
            prompt.extend(1000 + 10 * i..1000 + 10 * i + 5);
            RequestSpec::new(format!("user-{i}"), prompt)
        })
        .collect()
}
