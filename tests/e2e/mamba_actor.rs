//! The Mamba family actor hosted on every runtime beside the scheduler: one batch of ops
//! per message, answered in order; request pairs held outside the actor come home when
//! dropped; shutdown stops it and `take_core` gives it back.

use kvtier::{LocalSystem, System};
use kvtier_mamba::{MambaConfig, MambaCore, MambaMsg, MambaOp, MambaResult};
use kvtier_types::hash::rolling_page_hashes;

use crate::common::{RUNTIMES, config};

fn mamba() -> MambaCore {
    MambaCore::new(MambaConfig {
        page_size: 2,
        device_slots: 6,
        host_slots: 0,
        kernel_chunk: 4,
    })
    .expect("valid config")
}

fn ask(system: &mut LocalSystem, ops: Vec<MambaOp>) -> Vec<MambaResult> {
    let reply = system
        .ask::<MambaCore>(MambaMsg(ops))
        .expect("the actor answers");
    reply
        .0
        .into_iter()
        .map(|r| r.expect("op applied"))
        .collect()
}

fn free_slots(system: &mut LocalSystem) -> u32 {
    match ask(system, vec![MambaOp::Stats]).pop() {
        Some(MambaResult::Stats(s)) => s.free_device_slots,
        other => panic!("stats expected, got {other:?}"),
    }
}

#[test]
fn every_runtime_hosts_the_mamba_family() {
    let path = rolling_page_hashes(None, &[1, 2, 3, 4, 5, 6], 2);
    for runtime in RUNTIMES {
        let mut system = System::builder(config())
            .runtime(runtime)
            .mamba(mamba())
            .start_local()
            .expect("system starts");
        let admitted = match ask(&mut system, vec![MambaOp::Admit { source: None }]).pop() {
            Some(MambaResult::Admitted(Some(a))) => a,
            other => panic!("{runtime:?}: an admission expected, got {other:?}"),
        };
        assert_eq!(free_slots(&mut system), 4, "{runtime:?}");
        let checkpoint = admitted.states.checkpoint.expect("a checkpoint slot");
        // Publish the state after 2 pages, then match a prompt with 3 KV pages.
        let results = ask(
            &mut system,
            vec![
                MambaOp::Publish {
                    path: path[..2].to_vec(),
                    slot: checkpoint,
                },
                MambaOp::Match {
                    path: path.clone(),
                    kv_device_pages: 3,
                    kv_host_pages: 0,
                },
                MambaOp::CheckInvariants,
            ],
        );
        assert!(
            matches!(results[0], MambaResult::Published(true)),
            "{runtime:?}"
        );
        assert!(
            matches!(&results[1], MambaResult::Matched(m) if m.pages == 2),
            "{runtime:?}: {:?}",
            results[1]
        );
        // The working slot, held here, comes home when dropped.
        drop(admitted.states.working);
        assert_eq!(free_slots(&mut system), 5, "{runtime:?}");
        let mut core = system
            .take_core::<MambaCore>()
            .expect("call")
            .expect("the core comes back");
        assert_eq!(core.stats().device_states, 1, "{runtime:?}");
        core.check_invariants().expect("invariants");
        let report = system.shutdown().expect("shutdown");
        assert!(report.failure.is_none(), "{runtime:?}: {report:?}");
    }
}
