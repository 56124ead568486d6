//! Mutation tests of the oracle engine's integrity oracle: each plants one bug a
//! KV-cache system can have between the scheduler's plan and the engine, and the oracle
//! must name it (request, position, page, tier, layer, plane, provenance) and the answer
//! must change, under full and sampled verification.
//!
//! The workload runs three requests one after another on a small device pool, so that
//! every way KV reaches a row happens: `r1` computes and finishes (its pages are written
//! back), `r3` evicts `r1`'s device copy and then its own pages are evicted in turn, and
//! `r2` reuses `r1`'s prefix from the host tier (a load-back into pages `r3` used).

use std::collections::BTreeMap;

use kvtier_device::{DeviceCore, NewRequest};
use kvtier_fsm::Scheduler;
use kvtier_sim::oracle::{self, IntegrityError, OracleEngine, Provenance, Verify, WrongKv};
use kvtier_sim::scenario::scenario_geometry;
use kvtier_types::{
    EngineEvent, ExecutionPlan, PageId, RequestId, RequestSpec, RowKind, SchedulerConfig, Tier,
    Token,
};

const PAGE: u32 = 4;
const DEVICE_PAGES: u32 = 16;
const HOST_PAGES: u32 = 64;
const MODES: [Verify; 2] = [Verify::Full, Verify::Sampled(16)];

fn id(name: &str) -> RequestId {
    RequestId::from(name)
}

/// `r1`, then `r3` (unrelated, large enough to evict `r1` from device), then `r2`
/// (`r1`'s first four pages and a tail of its own).
fn requests() -> [(&'static str, Vec<Token>, usize); 3] {
    let r2: Vec<Token> = (1..=16).chain(501..=505).collect();
    [
        ("r1", (1..=17).collect(), 3),
        ("r3", (1001..=1040).collect(), 2),
        ("r2", r2, 3),
    ]
}

/// What a mutation may touch at one step.
struct Step<'a> {
    /// The request of the current phase.
    phase: &'a str,
    plan: &'a mut ExecutionPlan,
    device: &'a mut DeviceCore,
    /// Events appended after the device's own.
    extra_events: &'a mut Vec<EngineEvent>,
}

/// Answers and oracle errors of one run.
#[derive(Debug)]
struct Run {
    outputs: BTreeMap<RequestId, Vec<Token>>,
    errors: Vec<IntegrityError>,
}

fn run(verify: Verify, mut mutate: impl FnMut(&mut Step)) -> Run {
    let config = SchedulerConfig {
        page_size: PAGE,
        device_pages: DEVICE_PAGES,
        host_pages: HOST_PAGES,
        ..SchedulerConfig::default()
    };
    let mut scheduler = Scheduler::new(config).expect("config");
    let mut device = OracleEngine::new(scenario_geometry(PAGE), DEVICE_PAGES, verify)
        .and_then(|engine| engine.into_device(HOST_PAGES))
        .expect("arenas");
    for (name, prompt, max_new) in requests() {
        scheduler
            .submit(vec![RequestSpec::new(name, prompt.clone())])
            .expect("submit");
        let mut new = vec![NewRequest {
            id: id(name),
            prompt,
            max_new_tokens: max_new,
        }];
        for _ in 0..64 {
            if scheduler.is_idle() {
                break;
            }
            let mut plan = scheduler.next_plan();
            let mut extra_events = Vec::new();
            mutate(&mut Step {
                phase: name,
                plan: &mut plan,
                device: &mut device,
                extra_events: &mut extra_events,
            });
            let mut events = device
                .execute(&plan, &std::mem::take(&mut new))
                .expect("the device runs the plan");
            events.append(&mut extra_events);
            scheduler.advance(events).expect("advance");
        }
        assert!(scheduler.is_idle(), "{name} ran to the end");
    }
    let engine = device
        .runner()
        .and_then(|runner| runner.as_any().downcast_ref::<OracleEngine>())
        .expect("the oracle engine runs the forward");
    Run {
        outputs: engine.outputs.clone(),
        errors: engine.errors.clone(),
    }
}

fn clean(verify: Verify) -> Run {
    let run = run(verify, |_| {});
    assert_eq!(run.errors, [], "{verify:?}: the clean run is clean");
    assert_eq!(run.outputs.len(), 3, "{verify:?}: every request answered");
    run
}

/// The first error of a mutated run: a wrong slot, of the request named.
fn first_wrong(run: &Run, request: &str) -> WrongKv {
    let first = run.errors.first().expect("the oracle reports the mutation");
    let wrong = first.wrong_kv().expect("a wrong slot").clone();
    assert_eq!(wrong.request, id(request), "{first:?}");
    assert_eq!(wrong.tier, Tier::Device);
    wrong
}

fn assert_answer_changed(clean: &Run, mutated: &Run, request: &str) {
    assert_ne!(
        clean.outputs.get(&id(request)),
        mutated.outputs.get(&id(request)),
        "{request}'s answer depends on the KV it read"
    );
}

/// The page table of `request`'s row in `plan`, if it has one.
fn table_of(plan: &ExecutionPlan, request: &str) -> Option<Vec<PageId>> {
    let row = plan
        .forward
        .rows
        .iter()
        .find(|r| r.request_id == id(request))?;
    Some(plan.forward.page_table_of(row).to_vec())
}

#[test]
fn two_swapped_page_table_entries_are_caught() {
    for verify in MODES {
        let clean = clean(verify);
        let mut swapped = None;
        let mutated = run(verify, |step| {
            let forward = &mut step.plan.forward;
            let Some(row) = forward.rows.iter().find(|r| {
                r.request_id == id("r1") && r.kind == RowKind::Decode && r.pages_len >= 2
            }) else {
                return;
            };
            if swapped.is_some() {
                return;
            }
            let at = row.pages_start as usize;
            forward.page_table.swap(at, at + 1);
            swapped = Some(forward.page_table[at]);
        });
        let wrong = first_wrong(&mutated, "r1");
        assert_eq!(
            (wrong.position, Some(wrong.page), wrong.layer, wrong.plane),
            (0, swapped, 0, 0),
            "{verify:?}"
        );
        assert_eq!(wrong.provenance, Provenance::Computed, "{verify:?}");
        assert_answer_changed(&clean, &mutated, "r1");
    }
}

#[test]
fn a_load_back_from_the_wrong_host_page_is_caught() {
    for verify in MODES {
        let clean = clean(verify);
        let mut planted = None;
        let mutated = run(verify, |step| {
            if step.phase != "r2" || planted.is_some() {
                return;
            }
            let Some(op) = step.plan.load_backs.first_mut() else {
                return;
            };
            assert!(op.pairs.len() >= 2, "r2 loads back r1's prefix");
            op.pairs[0].src = op.pairs[1].src;
            let table = table_of(step.plan, "r2").expect("r2's first chunk");
            let dst = step.plan.load_backs[0].pairs[0].dst;
            let index = table.iter().position(|&p| p == dst).expect("r2 reads it");
            planted = Some((
                index as u32 * PAGE,
                dst,
                step.plan.load_backs[0].pairs[1].src,
            ));
        });
        let (position, page, host_page) = planted.expect("r2 loaded back");
        let wrong = first_wrong(&mutated, "r2");
        assert_eq!((wrong.position, wrong.page), (position, page), "{verify:?}");
        assert_eq!(wrong.provenance, Provenance::LoadedBack { host_page });
        assert_answer_changed(&clean, &mutated, "r2");
    }
}

#[test]
fn a_failed_write_back_acknowledged_as_success_is_caught() {
    for verify in MODES {
        let clean = clean(verify);
        let mut skipped: Option<Vec<PageId>> = None;
        let mutated = run(verify, |step| {
            if step.phase != "r1" || skipped.is_some() || step.plan.write_backs.is_empty() {
                return;
            }
            // The copy never happens, yet the engine reports success.
            let op = step.plan.write_backs.remove(0);
            step.extra_events.push(EngineEvent::WriteBackDone {
                op_id: op.op_id,
                success: true,
            });
            skipped = Some(op.pairs.iter().map(|p| p.dst).collect());
        });
        let never_written = skipped.expect("r1 was written back");
        let wrong = first_wrong(&mutated, "r2");
        assert_eq!(wrong.position, 0, "{verify:?}");
        let Provenance::LoadedBack { host_page } = wrong.provenance else {
            panic!("{verify:?}: {:?}", wrong.provenance);
        };
        assert!(never_written.contains(&host_page), "{host_page}");
        assert_answer_changed(&clean, &mutated, "r2");
    }
}

#[test]
fn a_page_served_after_it_was_freed_and_reused_is_caught() {
    for verify in MODES {
        let clean = clean(verify);
        let mut dropped: Option<Vec<PageId>> = None;
        let mutated = run(verify, |step| {
            if step.phase != "r2" || dropped.is_some() || step.plan.load_backs.is_empty() {
                return;
            }
            // The load-back is lost: r2 reads what the reused pages held before.
            let ops = std::mem::take(&mut step.plan.load_backs);
            dropped = Some(
                ops.iter()
                    .flat_map(|op| op.pairs.iter().map(|p| p.dst))
                    .collect(),
            );
        });
        let stale = dropped.expect("r2 loaded back");
        let wrong = first_wrong(&mutated, "r2");
        assert_eq!(wrong.position, 0, "{verify:?}");
        assert!(stale.contains(&wrong.page), "{wrong:?}");
        // r3 used those device pages last, and r2 never loaded them.
        assert_eq!(
            wrong.provenance,
            Provenance::PublishedBy(id("r3")),
            "{verify:?}"
        );
        assert_answer_changed(&clean, &mutated, "r2");
    }
}

#[test]
fn a_byte_corrupted_in_layer_1_plane_1_is_caught() {
    for verify in MODES {
        let clean = clean(verify);
        let mut first_page = None;
        let mut corrupted = false;
        let mutated = run(verify, |step| {
            if step.phase != "r1" || corrupted {
                return;
            }
            // One step after r1's prefill computed its first page.
            if let Some(page) = first_page {
                oracle::corrupt(step.device.arenas_mut(), page, 1, 1).expect("in range");
                corrupted = true;
            }
            first_page = table_of(step.plan, "r1").map(|table| table[0]);
        });
        let wrong = first_wrong(&mutated, "r1");
        assert_eq!(
            (wrong.position, Some(wrong.page), wrong.layer, wrong.plane),
            (0, first_page, 1, 1),
            "{verify:?}"
        );
        assert_eq!(wrong.provenance, Provenance::Computed);
        assert_answer_changed(&clean, &mutated, "r1");
    }
}

#[test]
fn a_row_for_a_finished_request_is_an_error() {
    for verify in MODES {
        let mut planted = false;
        let mutated = run(verify, |step| {
            if step.phase != "r3" || planted {
                return;
            }
            let Some(row) = step.plan.forward.rows.first() else {
                return;
            };
            let mut ghost = row.clone();
            ghost.request_id = id("r1");
            step.plan.forward.rows.push(ghost);
            planted = true;
        });
        assert_eq!(
            mutated.errors,
            [IntegrityError::UnknownRequest { request: id("r1") }],
            "{verify:?}"
        );
    }
}

#[test]
fn a_page_table_too_short_for_the_row_is_an_error() {
    for verify in MODES {
        let mut planted = false;
        let mutated = run(verify, |step| {
            if step.phase != "r1" || planted {
                return;
            }
            let Some(row) = step.plan.forward.rows.first_mut() else {
                return;
            };
            row.pages_len -= 1;
            planted = true;
        });
        let first = mutated.errors.first().expect("the oracle reports it");
        assert!(
            matches!(first, IntegrityError::ShortPageTable { request, .. } if *request == id("r1")),
            "{verify:?}: {first:?}"
        );
    }
}
