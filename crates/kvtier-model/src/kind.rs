//! The kinds of model kvtier serves, one per arrangement of cache families: what a
//! [`ModelSpec`] resolves to, and what a scenario names when it serves a kind rather
//! than a preset.

use kvtier_types::PagedSettings;

use crate::ModelSpec;

/// Which cache families a model needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum ModelKind {
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

impl ModelKind {
    /// Every kind, in the order above.
    pub const ALL: [ModelKind; 4] = [
        ModelKind::Dense,
        ModelKind::MambaHybrid,
        ModelKind::SlidingWindow,
        ModelKind::CompressedState,
    ];

    /// Lower-case name (`--model dense`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Dense => "dense",
            ModelKind::MambaHybrid => "mamba-hybrid",
            ModelKind::SlidingWindow => "sliding-window",
            ModelKind::CompressedState => "compressed-state",
        }
    }

    /// The kind of this name, if it is one.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// A window or compressed-state kind's groups, from the built-in preset it stands
    /// for (`gpt-oss-20b`, `deepseek-v4-flash`), pools unsized.
    pub fn group_templates(self, page_size: u32) -> Option<PagedSettings> {
        let preset = match self {
            ModelKind::Dense | ModelKind::MambaHybrid => return None,
            ModelKind::SlidingWindow => "gpt-oss-20b",
            ModelKind::CompressedState => "deepseek-v4-flash",
        };
        let spec = ModelSpec::preset(preset);
        debug_assert!(spec.is_ok(), "a built-in preset: {spec:?}");
        spec.ok()?.paged_templates(page_size)
    }
}

impl ModelSpec {
    /// The kind of model this is: which cache families it needs.
    pub fn kind(&self) -> ModelKind {
        match (self.needs_paged_family(), self.is_mamba_hybrid()) {
            (true, _) if self.group_templates.is_empty() => ModelKind::SlidingWindow,
            (true, _) => ModelKind::CompressedState,
            (false, true) => ModelKind::MambaHybrid,
            (false, false) => ModelKind::Dense,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for kind in ModelKind::ALL {
            assert_eq!(ModelKind::from_name(kind.name()), Some(kind));
        }
        assert_eq!(ModelKind::from_name("llama-3.1-8b"), None);
    }

    #[test]
    fn presets_resolve_to_their_kind() {
        let kind = |name| ModelSpec::preset(name).map(|spec| spec.kind()).ok();
        assert_eq!(kind("llama-3.1-8b"), Some(ModelKind::Dense));
        assert_eq!(kind("qwen3-next-80b-a3b"), Some(ModelKind::MambaHybrid));
        assert_eq!(kind("gpt-oss-20b"), Some(ModelKind::SlidingWindow));
        assert_eq!(kind("deepseek-v4-flash"), Some(ModelKind::CompressedState));
    }

    #[test]
    fn only_paged_kinds_have_groups() {
        assert!(ModelKind::Dense.group_templates(16).is_none());
        assert!(ModelKind::MambaHybrid.group_templates(16).is_none());
        assert!(ModelKind::SlidingWindow.group_templates(16).is_some());
        assert!(ModelKind::CompressedState.group_templates(16).is_some());
    }
}
