//! Mutation tests of the oracle engine's recurrent-state oracle (hybrid models):
//! each plants one bug between the scheduler's plan and the engine — a row copying the
//! wrong cached state, a cached state corrupted, a state load-back dropped — and the
//! oracle must name it (request, slot, position) and the answer must change.
//!
//! `r1` computes a 40-token prompt in chunks of 32 and 8 tokens and answers; its pages
//! and the states cached along them are written back to host and the device copies
//! demoted. `r2` shares `r1`'s first 32 tokens: its first chunk starts from `r1`'s
//! state at 32, loaded back from host with its pages.

use std::collections::BTreeMap;

use kvtier_device::{DeviceCore, NewRequest};
use kvtier_fsm::Scheduler;
use kvtier_sim::oracle::{IntegrityError, OracleEngine, Verify, WrongState};
use kvtier_sim::scenario::{SCENARIO_STATE, scenario_geometry};
use kvtier_types::{
    EngineEvent, ExecutionPlan, MambaSettings, RequestId, RequestSpec, SchedulerConfig, Tier,
    Token, TransferKind,
};

const PAGE: u32 = 4;
const CHUNK: u32 = 8;
const DEVICE_PAGES: u32 = 64;
const HOST_PAGES: u32 = 64;
const STATES: MambaSettings = MambaSettings {
    device_slots: 8,
    host_slots: 8,
    chunk: CHUNK,
};

fn id(name: &str) -> RequestId {
    RequestId::from(name)
}

/// What a mutation may touch at one step.
struct Step<'a> {
    phase: &'a str,
    plan: &'a mut ExecutionPlan,
    device: &'a mut DeviceCore,
}

#[derive(Debug)]
struct Run {
    outputs: BTreeMap<RequestId, Vec<Token>>,
    errors: Vec<IntegrityError>,
}

/// Runs `phases` one after another (each a request run to its end).
fn run(phases: &[(&str, Vec<Token>)], mut mutate: impl FnMut(&mut Step)) -> Run {
    let config = SchedulerConfig {
        page_size: PAGE,
        device_pages: DEVICE_PAGES,
        host_pages: HOST_PAGES,
        // r1 computes its prompt in chunks of 32 tokens: a state is cached at 32.
        max_scheduled_tokens: 32,
        mamba: Some(STATES),
        ..SchedulerConfig::default()
    };
    let mut scheduler = Scheduler::new(config).expect("config");
    let mut device = OracleEngine::new(scenario_geometry(PAGE), DEVICE_PAGES, Verify::Full)
        .and_then(|e| {
            e.with_states(
                SCENARIO_STATE,
                CHUNK,
                STATES.device_slots,
                STATES.host_slots,
            )
        })
        .and_then(|e| e.into_device(HOST_PAGES))
        .expect("arenas");
    for (name, prompt) in phases {
        scheduler
            .submit(vec![RequestSpec::new(*name, prompt.clone())])
            .expect("submit");
        let mut new = vec![NewRequest {
            id: id(name),
            prompt: prompt.clone(),
            max_new_tokens: 3,
        }];
        for _ in 0..64 {
            if scheduler.is_idle() {
                break;
            }
            let mut plan = scheduler.next_plan();
            mutate(&mut Step {
                phase: name,
                plan: &mut plan,
                device: &mut device,
            });
            let events: Vec<EngineEvent> = device
                .execute(&plan, &std::mem::take(&mut new))
                .expect("the device runs the plan");
            scheduler.advance(events).expect("advance");
        }
        assert!(scheduler.is_idle(), "{name} ran to the end");
    }
    let engine = OracleEngine::of(&device).expect("the oracle engine");
    Run {
        outputs: engine.outputs.clone(),
        errors: engine.errors.clone(),
    }
}

fn prompts() -> Vec<(&'static str, Vec<Token>)> {
    vec![
        ("r1", (1..=40).collect()),
        ("r2", (1..=32).chain(901..=910).collect()),
    ]
}

fn first_wrong_state(run: &Run, request: &str) -> WrongState {
    let first = run.errors.first().expect("the oracle reports the mutation");
    let IntegrityError::WrongState(wrong) = first else {
        panic!("a wrong state, not {first:?}");
    };
    assert_eq!(wrong.request, id(request), "{first:?}");
    wrong.clone()
}

/// `r2`'s first row, if this plan has it.
fn r2_row(plan: &mut ExecutionPlan) -> Option<&mut kvtier_types::ForwardRow> {
    plan.forward
        .rows
        .iter_mut()
        .find(|r| r.request_id == id("r2"))
}

#[test]
fn a_clean_run_resumes_from_a_host_state_and_answers_as_without_it() {
    let mut resumed = None;
    let clean = run(&prompts(), |step| {
        let loaded = step
            .plan
            .load_backs
            .iter()
            .flat_map(|op| &op.pairs)
            .filter(|p| p.kind == TransferKind::Mamba)
            .count();
        if step.phase == "r2"
            && let Some(row) = r2_row(step.plan)
            && row.extend_prefix_len > 0
        {
            resumed = Some((row.extend_prefix_len, row.mamba.cow_src, loaded));
        }
    });
    assert_eq!(clean.errors, [], "the clean run is clean");
    let (prefix, cow, loaded) = resumed.expect("r2 reuses r1's prefix");
    assert_eq!(prefix, 32, "r2 starts from r1's state after 32 tokens");
    assert!(cow.is_some(), "from a cached state");
    assert_eq!(loaded, 1, "loaded back from host with its pages");
    // Alone, r2 computes its whole prompt: the same answer.
    let alone = run(&prompts()[1..], |_| {});
    assert_eq!(clean.outputs[&id("r2")], alone.outputs[&id("r2")]);
}

#[test]
fn a_row_copying_the_wrong_state_is_caught() {
    let clean = run(&prompts(), |_| {});
    let mutated = run(&prompts(), |step| {
        if let Some(row) = r2_row(step.plan)
            && row.mamba.cow_src.is_some()
        {
            // Start from the request's own (fresh) checkpoint slot instead.
            row.mamba.cow_src = row.mamba.checkpoint_dst;
        }
    });
    let wrong = first_wrong_state(&mutated, "r2");
    assert_eq!(wrong.position, 32);
    assert_ne!(
        wrong.found, 32,
        "the slot does not hold the state after 32 tokens"
    );
    assert_ne!(clean.outputs[&id("r2")], mutated.outputs[&id("r2")]);
}

#[test]
fn a_dropped_state_load_back_is_caught() {
    let clean = run(&prompts(), |_| {});
    let mutated = run(&prompts(), |step| {
        for op in &mut step.plan.load_backs {
            op.pairs.retain(|p| p.kind != TransferKind::Mamba);
        }
    });
    let wrong = first_wrong_state(&mutated, "r2");
    assert_eq!(wrong.position, 32);
    assert_ne!(clean.outputs[&id("r2")], mutated.outputs[&id("r2")]);
}

#[test]
fn a_corrupted_cached_state_is_caught() {
    let clean = run(&prompts(), |_| {});
    let mutated = run(&prompts(), |step| {
        let Some(row) = r2_row(step.plan) else { return };
        let (Some(src), true) = (row.mamba.cow_src, row.extend_prefix_len > 0) else {
            return;
        };
        // After the load-back lands and before the copy: flip a byte of the host copy the
        // load-back reads from, else of the device state itself.
        let from_host = step
            .plan
            .load_backs
            .iter()
            .flat_map(|op| &op.pairs)
            .find(|p| p.kind == TransferKind::Mamba && p.dst == src)
            .map(|p| p.src);
        let (tier, slot) = match from_host {
            Some(host) => (Tier::Host, host),
            None => (Tier::Device, src),
        };
        let mut item = step
            .device
            .arenas_mut()
            .state_item_mut(tier, slot, 1)
            .expect("a state slot");
        item[12] ^= 0x5a;
    });
    let wrong = first_wrong_state(&mutated, "r2");
    assert_eq!(wrong.position, 32);
    assert_eq!(
        wrong.found, 32,
        "the right state's position, with a corrupt layer"
    );
    assert_ne!(clean.outputs[&id("r2")], mutated.outputs[&id("r2")]);
}
