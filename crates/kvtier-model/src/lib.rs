//! Model presets of kvtier: the scheduler's model side derived from a Hugging Face
//! `config.json`.
//!
//! A user points kvtier at a model's `config.json` (or names a built-in preset) instead
//! of filling in geometry by hand. [`ModelSpec`] says what the scheduler and the data
//! plane need of the model:
//!
//! * the KV of its full-attention layers, paged by tokens in the main pool
//!   ([`KvShape`]);
//! * sliding-window attention layers and their window ([`WindowLayers`]);
//! * a recurrent-state family for Mamba or linear-attention hybrids ([`StateShape`]:
//!   the Mamba family's slots and checkpoint chunk);
//! * paged-cache groups (DeepSeek-V4's sliding, compressed and state groups), sized for
//!   a serving budget by [`ModelSpec::groups`];
//! * the mid-flight publication gate ([`ModelSpec::gate`]).
//!
//! Supported architectures (`model_type`): `llama`, `mistral`, `qwen2`, `qwen3`
//! (full or plain sliding attention), `gpt_oss` (alternating window and full layers),
//! `deepseek_v4` (paged groups), `qwen3_next` and `nemotron_h` (Mamba family). An
//! unknown architecture or a missing field is a [`ModelError`] naming it.

mod derive;
mod error;
mod json;
mod kind;

use kvtier_paged::{CacheShape, GroupSpec, MidflightGate, PoolBudget};

pub use error::ModelError;
pub use kind::ModelKind;

/// The KV of the full-attention layers, paged by tokens in the scheduler's main pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    /// Full-attention layers.
    pub layers: u32,
    /// KV planes per layer: 2 (K and V).
    pub planes: u32,
    /// KV heads per plane.
    pub kv_heads: u32,
    /// Elements per head.
    pub head_dim: u32,
    /// Bytes per element.
    pub dtype_bytes: u32,
}

impl KvShape {
    /// Bytes one token takes over all these layers.
    pub fn bytes_per_token(&self) -> u64 {
        u64::from(self.layers)
            * u64::from(self.planes)
            * u64::from(self.kv_heads)
            * u64::from(self.head_dim)
            * u64::from(self.dtype_bytes)
    }
}

/// Sliding-window attention layers (each keeps only its last `window` tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowLayers {
    /// How many layers slide.
    pub layers: u32,
    /// Tokens the window spans, the current token included (HF's `sliding_window`).
    pub window: u32,
    /// The same per-layer geometry as the full layers.
    pub kv: KvShape,
}

/// The recurrent state of a Mamba or linear-attention hybrid: the Mamba family's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateShape {
    /// Recurrent layers.
    pub layers: u32,
    /// Bytes of one request's state over all recurrent layers (convolution state in
    /// the model's dtype, SSM state in its cache dtype, float32 unless the config says).
    pub bytes_per_request: u64,
    /// The scan kernel's chunk: intermediate checkpoints and branching lengths align to
    /// it (the reference's `mamba_cache_chunk_size`).
    pub checkpoint_chunk: u32,
}

/// What kvtier needs to know of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    /// The preset's name, or the config's `model_type` when read from a file.
    pub name: String,
    /// The config's `model_type`.
    pub model_type: String,
    /// Longest context (`max_position_embeddings`).
    pub context_len: u32,
    /// A KV page size the model's kernels require (DeepSeek-V4: 256), if any.
    pub page_size: Option<u32>,
    /// Full-attention KV in the main pool (`None`: the model keeps all of its KV in
    /// paged groups).
    pub kv: Option<KvShape>,
    /// Sliding-window attention layers.
    pub window: Option<WindowLayers>,
    /// Mamba-family state.
    pub state: Option<StateShape>,
    /// Paged-cache groups, unsized (`total_pages` 0 until [`Self::groups`] sizes them),
    /// in group-id byte order.
    pub group_templates: Vec<GroupSpec>,
    /// The groups a prefix needs for reuse (the adjunct's required groups), in the
    /// order the first is read by commits.
    pub required_groups: Vec<String>,
    /// What the mid-flight gate decides on.
    pub cache_shape: CacheShape,
}

impl ModelSpec {
    /// Reads a `config.json` text; `name` labels the result.
    pub fn from_config_json(name: &str, text: &str) -> Result<Self, ModelError> {
        let root: serde_json::Value =
            serde_json::from_str(text).map_err(|e| ModelError::Json(e.to_string()))?;
        derive::derive(name, &root)
    }

    /// Reads a `config.json` file.
    pub fn from_config_file(path: &std::path::Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::Io {
            path: path.display().to_string(),
            problem: e.to_string(),
        })?;
        let spec = Self::from_config_json("", &text)?;
        Ok(Self {
            name: spec.model_type.clone(),
            ..spec
        })
    }

    /// A built-in preset by name (see [`PRESETS`]).
    pub fn preset(name: &str) -> Result<Self, ModelError> {
        let (_, text) =
            PRESETS
                .iter()
                .find(|(n, _)| *n == name)
                .ok_or_else(|| ModelError::UnknownPreset {
                    name: name.to_owned(),
                    known: preset_names().join(", "),
                })?;
        Self::from_config_json(name, text)
    }

    /// The mid-flight publication gate at a KV page size.
    pub fn gate(&self, page_size: u32) -> MidflightGate {
        MidflightGate::for_shape(self.cache_shape, page_size)
    }

    /// Whether the model needs the Mamba family.
    pub fn is_mamba_hybrid(&self) -> bool {
        self.state.is_some()
    }

    /// Whether the model needs the paged-cache family (window layers or paged groups).
    pub fn needs_paged_family(&self) -> bool {
        self.window.is_some() || !self.group_templates.is_empty()
    }

    /// The paged-cache groups sized for a serving budget (TokenSpeed's
    /// `compute_paged_cache_group_page_counts`), in group-id byte order. Window layers
    /// of the main KV become one sliding group of `page_size` rows.
    pub fn groups(&self, page_size: u32, budget: &PoolBudget) -> Vec<GroupSpec> {
        self.paged_settings(page_size, budget)
            .map_or_else(Vec::new, |p| p.groups)
    }

    /// The scheduler's paged-cache side ([`kvtier_types::PagedSettings`]) at a KV page
    /// size, pools sized for `budget`; `None` for a model without groups.
    pub fn paged_settings(
        &self,
        page_size: u32,
        budget: &PoolBudget,
    ) -> Option<kvtier_types::PagedSettings> {
        let mut paged = self.paged_templates(page_size)?;
        for g in &mut paged.groups {
            g.total_pages = budget.pool_pages(g);
        }
        Some(paged)
    }

    /// [`Self::paged_settings`] with every pool left at 0 pages, for a caller that sizes
    /// them itself. A window model's sliding-layer group is required, so its prefixes
    /// are reusable where a snapshot holds their window.
    pub fn paged_templates(&self, page_size: u32) -> Option<kvtier_types::PagedSettings> {
        if !self.needs_paged_family() {
            return None;
        }
        let mut groups = self.group_templates.clone();
        let mut required = self.required_groups.clone();
        if let Some(w) = &self.window {
            groups.push(GroupSpec::sliding(
                WINDOW_GROUP,
                page_size,
                1,
                0,
                w.window,
                kvtier_paged::GroupRole::History,
            ));
            if !required.iter().any(|g| g == WINDOW_GROUP) {
                required.push(WINDOW_GROUP.to_owned());
            }
        }
        groups.sort_by(|a, b| a.id.cmp(&b.id));
        Some(kvtier_types::PagedSettings { groups, required })
    }
}

/// The group that holds a window model's sliding-layer KV.
pub const WINDOW_GROUP: &str = "swa.kv";

/// The built-in presets: name and `config.json` (only the fields kvtier reads, with the
/// published models' values).
pub const PRESETS: &[(&str, &str)] = &[
    ("llama-3.1-8b", include_str!("../presets/llama-3.1-8b.json")),
    ("qwen3-8b", include_str!("../presets/qwen3-8b.json")),
    ("gpt-oss-20b", include_str!("../presets/gpt-oss-20b.json")),
    ("gpt-oss-120b", include_str!("../presets/gpt-oss-120b.json")),
    (
        "deepseek-v4-flash",
        include_str!("../presets/deepseek-v4-flash.json"),
    ),
    (
        "qwen3-next-80b-a3b",
        include_str!("../presets/qwen3-next-80b-a3b.json"),
    ),
    (
        "nemotron-nano-9b-v2",
        include_str!("../presets/nemotron-nano-9b-v2.json"),
    ),
    (
        "nemotron-3-nano-30b-a3b",
        include_str!("../presets/nemotron-3-nano-30b-a3b.json"),
    ),
];

/// The names of the built-in presets.
pub fn preset_names() -> Vec<&'static str> {
    PRESETS.iter().map(|(n, _)| *n).collect()
}
