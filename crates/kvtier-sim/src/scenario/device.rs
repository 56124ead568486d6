//! The device of a scenario: its geometry, and a device core with the oracle engine as its
//! model runner.

use kvtier_device::{DeviceCore, DeviceError, KvGeometry};
use kvtier_types::{MambaSettings, PagedSettings};

use super::*;
use crate::oracle::{OracleEngine, Verify};

/// KV geometry of the scenarios: small, so full verification stays cheap.
pub fn scenario_geometry(page_size: u32) -> KvGeometry {
    KvGeometry {
        layers: 2,
        planes: 2,
        heads: 1,
        head_dim: 4,
        dtype_bytes: 2,
        page_size,
    }
}

/// A device core over fresh arenas of the scenario geometry, with the oracle engine as
/// its model runner (pools include page 0).
pub fn oracle_device(
    page_size: u32,
    device_pages: u32,
    host_pages: u32,
    verify: Verify,
) -> Result<DeviceCore, DeviceError> {
    hybrid_oracle_device(page_size, device_pages, host_pages, verify, None, None)
}

/// [`oracle_device`] for a hybrid model with these state pools, when `states` says
/// so, and for a paged model with these groups, when `groups` says so.
pub fn hybrid_oracle_device(
    page_size: u32,
    device_pages: u32,
    host_pages: u32,
    verify: Verify,
    states: Option<MambaSettings>,
    groups: Option<&PagedSettings>,
) -> Result<DeviceCore, DeviceError> {
    let mut engine = OracleEngine::new(scenario_geometry(page_size), device_pages, verify)?;
    if let Some(m) = states {
        engine = engine.with_states(SCENARIO_STATE, m.chunk, m.device_slots, m.host_slots)?;
    }
    if let Some(p) = groups {
        engine = engine.with_groups(p.groups.clone());
    }
    engine.into_device(host_pages)
}
