//! The scenario models: which family each built-in model has, and the scenario geometry's
//! constants.

use kvtier_device::StateGeometry;
use kvtier_types::{GroupSpec, PagedSettings};

/// The model a scenario serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Model {
    /// Full attention: KV only.
    #[default]
    Dense,
    /// Attention layers beside Mamba layers (Qwen3-Next, Nemotron-H style): KV and a
    /// recurrent state per request, checkpointed at page boundaries.
    MambaHybrid,
    /// Full-attention KV beside sliding-window layers (gpt-oss style): the window
    /// layers' KV in a sliding group of 128 tokens.
    SlidingWindow,
    /// DeepSeek-V4 style: a sliding window of 128 tokens, KV compressed by 4 and by 128
    /// and their compressor states, all in paged-cache groups.
    CompressedState,
}

impl Model {
    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Model::Dense => "dense",
            Model::MambaHybrid => "mamba-hybrid",
            Model::SlidingWindow => "sliding-window",
            Model::CompressedState => "compressed-state",
        }
    }

    /// A window or compressed-state model's groups, from the built-in presets it stands
    /// for (`gpt-oss-20b`, `deepseek-v4-flash`), pools unsized ([`scenario_groups`]
    /// sizes them per run).
    pub fn group_templates(self) -> Option<PagedSettings> {
        let preset = match self {
            Model::Dense | Model::MambaHybrid => return None,
            Model::SlidingWindow => "gpt-oss-20b",
            Model::CompressedState => "deepseek-v4-flash",
        };
        let spec = kvtier_model::ModelSpec::preset(preset);
        debug_assert!(spec.is_ok(), "a built-in preset: {spec:?}");
        spec.ok()?.paged_templates(SCENARIO_PAGE_SIZE)
    }
}

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
