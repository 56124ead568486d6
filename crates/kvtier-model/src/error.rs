//! The error type of this crate.

/// Why a model config could not be turned into a [`crate::ModelSpec`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The file could not be read.
    #[error("cannot read model config {path}: {problem}")]
    Io {
        /// The file.
        path: String,
        /// What the OS said.
        problem: String,
    },
    /// The text is not JSON (or not an object).
    #[error("model config is not a JSON object: {0}")]
    Json(String),
    /// No `model_type`, or one kvtier does not know.
    #[error(
        "unsupported model architecture `{0}` (supported: llama, mistral, qwen2, qwen3, gpt_oss, deepseek_v4, qwen3_next, nemotron_h)"
    )]
    UnknownArchitecture(String),
    /// A field the architecture needs is missing (or null).
    #[error("model config of `{model_type}` lacks `{field}`")]
    MissingField {
        /// The architecture.
        model_type: String,
        /// The field (a dotted path for nested ones).
        field: String,
    },
    /// A field has a value kvtier cannot use.
    #[error("model config of `{model_type}`: `{field}` {problem}")]
    InvalidField {
        /// The architecture.
        model_type: String,
        /// The field.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// No built-in preset has this name.
    #[error("unknown model preset `{name}` (known: {known})")]
    UnknownPreset {
        /// The name asked for.
        name: String,
        /// The presets there are.
        known: String,
    },
}
