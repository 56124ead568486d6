//! A minimal engine loop embedding kvtier.
//!
//! The engine submits a few prompts that share a system prompt, then loops: ask the
//! scheduler for a plan, "run" it (here: one made-up token per finished row, a finish
//! after a few tokens, every write-back copy reported done), and feed the results back.
//! A real engine would run the plan's copies and its forward rows on the GPU instead.
//!
//! Run it with `cargo run -p kvtier-examples --example minimal_engine`.

use kvtier::{Handle, KvError, ShutdownReport, SystemStats, block_on};
use kvtier_examples::run_plan;
use kvtier_types::{EngineEvent, SchedulerConfig};

/// What one run did.
#[derive(Debug)]
pub struct Summary {
    /// Steps (plans) run.
    pub steps: usize,
    /// Requests that finished.
    pub finished: usize,
    /// Requests the scheduler gave up on by itself (see `ExecutionPlan::aborted`).
    pub aborted: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u64,
    /// Counters at the end.
    pub stats: SystemStats,
    /// What shutdown found (every page and lock returned).
    pub report: ShutdownReport,
}

/// The engine loop, over the async handle.
async fn main_loop(handle: Handle) -> Result<Summary, KvError> {
    let requests = kvtier_examples::users_sharing_a_system_prompt();
    let total = requests.len();
    let mut arrivals = requests.into_iter();
    // The first user arrives alone; the others a step later, when the system prompt is
    // already computed (and published mid-flight), so they reuse it.
    handle.submit(arrivals.next().into_iter().collect()).await?;

    let mut produced = Default::default();
    let (mut steps, mut finished, mut aborted, mut cached_tokens) = (0, 0, 0, 0);
    while finished + aborted < total {
        if steps == 1 {
            handle.submit(arrivals.by_ref().collect()).await?;
        }
        let plan = handle.next_plan().await?;
        steps += 1;
        // The scheduler may give up on a request (e.g. no host page to retract it to):
        // it is gone, stop waiting for it.
        aborted += plan.aborted.len();
        cached_tokens += plan
            .forward
            .prefill_rows()
            .iter()
            .map(|r| u64::from(r.extend_prefix_len))
            .sum::<u64>();
        let events = run_plan(&plan, &mut produced);
        finished += events
            .iter()
            .filter(|e| matches!(e, EngineEvent::Finish { .. }))
            .count();
        handle.advance(events).await?;
    }
    // The finished requests' write-backs go out with the next plans: acknowledge them
    // until nothing is left in flight.
    while !handle.stats().await?.scheduler.idle {
        let plan = handle.next_plan().await?;
        handle.advance(run_plan(&plan, &mut produced)).await?;
    }

    let stats = handle.stats().await?;
    let report = handle.shutdown().await?;
    Ok(Summary {
        steps,
        finished,
        aborted,
        cached_tokens,
        stats,
        report,
    })
}

/// Starts a system and runs the loop to the end.
pub fn run() -> Result<Summary, KvError> {
    let config = SchedulerConfig {
        page_size: 16,
        device_pages: 64,
        host_pages: 128,
        ..SchedulerConfig::default()
    };
    let handle = kvtier::System::builder(config).start()?;
    // Any executor drives the handle's futures; this example needs none beyond kvtier's.
    block_on(main_loop(handle))
}

#[allow(
    dead_code,
    reason = "the test includes this file and calls run() instead"
)]
fn main() -> Result<(), KvError> {
    let s = run()?;
    println!(
        "{} requests finished ({} aborted by the scheduler) in {} steps",
        s.finished, s.aborted, s.steps
    );
    println!(
        "prompt tokens served from the prefix cache: {}",
        s.cached_tokens
    );
    println!(
        "cached pages: {} on device, {} on host",
        s.stats.scheduler.cached_device_pages, s.stats.scheduler.cached_host_pages
    );
    println!(
        "shutdown clean: {} ({:?})",
        s.report.is_clean(),
        s.report.conservation
    );
    Ok(())
}
