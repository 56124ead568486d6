//! The system a run drives, behind one trait: the actors (`LocalSystem`), or the direct
//! path (the scheduler over its own cache, with the device and the L3 core in place).

use std::sync::Arc;

use kvtier::{KvError, LocalSystem};
use kvtier_device::{DeviceCore, NewRequest};
use kvtier_fsm::{Scheduler, StateKind};
use kvtier_l3::{L3Core, LocalStore, LocalStoreConfig};
use kvtier_types::{EngineEvent, ExecutionPlan, KvEvent, RequestId, RequestSpec, Token};

use crate::campaign::CampaignError;
use crate::campaign::faults::{CampaignCopyFaults, CampaignL3Faults, FaultTally};
use crate::campaign::spec::RunSpec;
use crate::scenario::{l3_core_over, oracle_device, scratch_dir};

/// The system a run drives: the actors, or the direct path.
pub(super) trait Sut {
    fn submit(&mut self, specs: Vec<RequestSpec>) -> Result<(), KvError>;
    fn next_plan(&mut self) -> Result<ExecutionPlan, KvError>;
    fn execute(
        &mut self,
        plan: ExecutionPlan,
        new: Vec<NewRequest>,
    ) -> Result<Vec<EngineEvent>, KvError>;
    fn advance(&mut self, events: Vec<EngineEvent>) -> Result<(), KvError>;
    fn abort(&mut self, id: RequestId) -> Result<(), KvError>;
    fn idle(&mut self) -> Result<bool, KvError>;
    /// The request's state (the direct path only).
    fn state(&self, _id: &RequestId) -> Option<StateKind> {
        None
    }
    /// The scheduler invariants after a call (the direct path only).
    fn check(&mut self) -> Result<(), String> {
        Ok(())
    }
    /// Leading pages of `tokens` readable on host in the cache (the direct path only).
    fn host_pages(&self, _tokens: &[Token]) -> Option<u32> {
        None
    }
    /// KV events since the last call (the direct path only; the actors' are taken once,
    /// at the end, and compared with these).
    fn kv_events(&mut self) -> Vec<KvEvent> {
        Vec::new()
    }
}

impl Sut for LocalSystem {
    fn submit(&mut self, specs: Vec<RequestSpec>) -> Result<(), KvError> {
        // Every plan must equal the direct run's: lookups answer before the next one.
        self.submit_settled(specs)
    }

    fn next_plan(&mut self) -> Result<ExecutionPlan, KvError> {
        LocalSystem::next_plan(self)
    }

    fn execute(
        &mut self,
        plan: ExecutionPlan,
        new: Vec<NewRequest>,
    ) -> Result<Vec<EngineEvent>, KvError> {
        LocalSystem::execute(self, plan, new)
    }

    fn advance(&mut self, events: Vec<EngineEvent>) -> Result<(), KvError> {
        LocalSystem::advance(self, events)
    }

    fn abort(&mut self, id: RequestId) -> Result<(), KvError> {
        LocalSystem::abort(self, id)
    }

    fn idle(&mut self) -> Result<bool, KvError> {
        Ok(self.stats()?.scheduler.idle)
    }
}

/// The direct path: the scheduler over its own cache, the device and the L3 core called
/// in place.
pub(super) struct Direct {
    pub(super) scheduler: Scheduler,
    pub(super) device: DeviceCore,
    pub(super) l3: Option<L3Core>,
}

impl Sut for Direct {
    fn submit(&mut self, mut specs: Vec<RequestSpec>) -> Result<(), KvError> {
        // As the conversation does: the prompts are looked up in L3 first.
        let config = self.scheduler.config();
        let (lookup, threshold) = (config.l3_prefetch_enabled(), config.prefetch_threshold);
        if lookup && let Some(l3) = &mut self.l3 {
            l3.lookup(&mut specs, threshold);
        }
        Ok(self.scheduler.submit(specs)?)
    }

    fn next_plan(&mut self) -> Result<ExecutionPlan, KvError> {
        Ok(self.scheduler.next_plan())
    }

    fn execute(
        &mut self,
        plan: ExecutionPlan,
        new: Vec<NewRequest>,
    ) -> Result<Vec<EngineEvent>, KvError> {
        // As the conversation does: the L3 store's mail goes first; the device's events
        // come first.
        let l3_events = match &mut self.l3 {
            Some(l3) if !(plan.prefetches.is_empty() && plan.backups.is_empty()) => {
                l3.transfer(&plan.prefetches, &plan.backups)
            }
            _ => Vec::new(),
        };
        let mut events = self.device.execute(&plan, &new)?;
        events.extend(l3_events);
        Ok(events)
    }

    fn advance(&mut self, events: Vec<EngineEvent>) -> Result<(), KvError> {
        Ok(self.scheduler.advance(events)?)
    }

    fn abort(&mut self, id: RequestId) -> Result<(), KvError> {
        Ok(self.scheduler.abort(&id)?)
    }

    fn idle(&mut self) -> Result<bool, KvError> {
        Ok(self.scheduler.is_idle())
    }

    fn state(&self, id: &RequestId) -> Option<StateKind> {
        self.scheduler.request_state(id)
    }

    fn check(&mut self) -> Result<(), String> {
        self.scheduler.check_invariants().map_err(|e| e.to_string())
    }

    fn host_pages(&self, tokens: &[Token]) -> Option<u32> {
        Some(self.scheduler.cache().probe(tokens).host_pages)
    }

    fn kv_events(&mut self) -> Vec<KvEvent> {
        self.scheduler.drain_kv_events()
    }
}

/// The device, the L3 core (cache on, when drawn) and the store's directory of a run.
pub(super) fn build(
    spec: &RunSpec,
    cache: bool,
    tally: &Arc<FaultTally>,
) -> Result<(DeviceCore, Option<L3Core>, Option<tempfile::TempDir>), CampaignError> {
    let mut device = oracle_device(
        spec.page_size,
        spec.device_pages,
        spec.host_pages,
        spec.verify,
    )?;
    if cache {
        device = device.with_faults(Box::new(CampaignCopyFaults::new(
            spec.seed,
            &spec.faults,
            tally,
        )));
    }
    let Some(l3) = spec.l3.as_ref().filter(|_| cache) else {
        return Ok((device, None, None));
    };
    let dir = scratch_dir("campaign-l3")?;
    let arena = device.arenas_mut().host_arena();
    let page_bytes = arena.page_bytes() as u64;
    let mut config = LocalStoreConfig::new(
        dir.path(),
        u64::from(l3.memory_pages) * page_bytes,
        match l3.disk_pages {
            0 => 1 << 30,
            pages => u64::from(pages) * page_bytes,
        },
    );
    config.prefetch_workers = 1;
    let store = LocalStore::open(config).map_err(|e| CampaignError::Setup(e.to_string()))?;
    let core = l3_core_over(Box::new(store), "kvtier-campaign", spec.page_size, arena)?
        .with_faults(Box::new(CampaignL3Faults::new(
            spec.seed,
            &spec.faults,
            tally,
            page_bytes as usize,
        )));
    Ok((device, Some(core), Some(dir)))
}
