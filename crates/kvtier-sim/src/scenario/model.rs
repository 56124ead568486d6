//! The scenario geometry's constants, and a paged model's group pools sized for a run.

use kvtier_device::StateGeometry;
use kvtier_types::{GroupSpec, PagedSettings};

/// Sizes a paged model's group pools for a run: room for as many tokens as the device
/// KV pool holds (snapshots go with their node's device KV, so they never hold more),
/// plus, per running request, a chunk, its window and a page of slack each.
pub fn scenario_groups(
    templates: &PagedSettings,
    device_pages: u32,
    batch: u32,
    budget: u32,
) -> PagedSettings {
    let tokens = device_pages * SCENARIO_PAGE_SIZE;
    let groups = templates
        .groups
        .iter()
        .map(|g| {
            let window = g.pages_for(g.window().unwrap_or(0));
            let per_request = g.pages_for(budget) + window + 2;
            GroupSpec {
                total_pages: g.pages_for(tokens) + batch * per_request + 1,
                ..g.clone()
            }
        })
        .collect();
    PagedSettings {
        groups,
        required: templates.required.clone(),
    }
}

/// The recurrent state of the scenarios' hybrid model: 2 Mamba layers of 32 bytes.
pub const SCENARIO_STATE: StateGeometry = StateGeometry {
    layers: 2,
    bytes_per_layer: 32,
};

/// Tokens per KV page in every scenario.
pub const SCENARIO_PAGE_SIZE: u32 = 16;

/// The scan kernel's chunk of the scenarios' hybrid model.
pub const SCENARIO_STATE_CHUNK: u32 = 64;
