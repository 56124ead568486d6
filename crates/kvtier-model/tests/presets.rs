//! Model presets: every built-in preset derives, each architecture's fields map to the
//! right families, and bad configs get errors that name the field.

use kvtier_model::{ModelError, ModelSpec, PRESETS, WINDOW_GROUP};
use kvtier_paged::{CacheShape, GroupRole, MidflightGate, PoolBudget};

fn spec(json: &str) -> Result<ModelSpec, ModelError> {
    ModelSpec::from_config_json("test", json)
}

#[test]
fn every_preset_derives() {
    for (name, _) in PRESETS {
        let spec = ModelSpec::preset(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(spec.name, *name);
        assert!(spec.context_len > 0, "{name}");
    }
    let err = ModelSpec::preset("gpt-5").unwrap_err().to_string();
    assert!(
        err.contains("gpt-5") && err.contains("llama-3.1-8b"),
        "{err}"
    );
}

#[test]
fn llama_is_full_attention_with_head_dim_from_hidden_size() {
    let s = ModelSpec::preset("llama-3.1-8b").unwrap();
    let kv = s.kv.unwrap();
    assert_eq!(
        (
            kv.layers,
            kv.planes,
            kv.kv_heads,
            kv.head_dim,
            kv.dtype_bytes
        ),
        (32, 2, 8, 128, 2)
    );
    assert_eq!(kv.bytes_per_token(), 131_072);
    assert!(s.window.is_none() && s.state.is_none() && s.group_templates.is_empty());
    assert_eq!(s.gate(64), MidflightGate::UNCAPPED);
}

#[test]
fn qwen3_window_means_nothing_without_use_sliding_window() {
    let s = ModelSpec::preset("qwen3-8b").unwrap();
    assert_eq!(s.kv.unwrap().bytes_per_token(), 147_456);
    assert_eq!(s.cache_shape, CacheShape::NoWindow);
    // Switched on, the layers from max_window_layers up slide.
    let on = spec(
        r#"{"model_type": "qwen3", "num_hidden_layers": 8, "num_attention_heads": 4,
            "head_dim": 16, "max_position_embeddings": 4096, "sliding_window": 64,
            "use_sliding_window": true, "max_window_layers": 6}"#,
    )
    .unwrap();
    assert_eq!(on.kv.unwrap().layers, 6);
    assert_eq!(on.window.unwrap().layers, 2);
    assert_eq!(on.window.unwrap().window, 64);
    assert_eq!(on.cache_shape, CacheShape::PlainWindow { window: 64 });
}

#[test]
fn mistral_is_a_plain_window_model_capped_at_floor_w_over_p() {
    let s = spec(
        r#"{"model_type": "mistral", "num_hidden_layers": 4, "num_attention_heads": 8,
            "num_key_value_heads": 2, "hidden_size": 512, "max_position_embeddings": 8192,
            "sliding_window": 100}"#,
    )
    .unwrap();
    assert_eq!(s.kv.unwrap().head_dim, 64);
    assert!(
        s.window.is_none(),
        "every layer slides: the main pool keeps them"
    );
    assert_eq!(
        s.gate(16),
        MidflightGate {
            enabled: true,
            max_pages: Some(6)
        }
    );
}

#[test]
fn gpt_oss_alternates_window_and_full_layers_and_never_publishes_mid_flight() {
    let s = ModelSpec::preset("gpt-oss-20b").unwrap();
    let kv = s.kv.unwrap();
    assert_eq!((kv.layers, kv.kv_heads, kv.head_dim), (12, 8, 64));
    let w = s.window.unwrap();
    assert_eq!((w.layers, w.window), (12, 128));
    assert_eq!(s.gate(16), MidflightGate::OFF);
    let budget = PoolBudget {
        max_live_requests: 16,
        max_scheduled_tokens: 2048,
        max_total_tokens: 160 * 16,
        max_context_len: 131_072,
        sliding_safety_margin: 0,
    };
    let groups = s.groups(16, &budget);
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].id, WINDOW_GROUP);
    assert_eq!(groups[0].window(), Some(128));
    // 16 live windows of ceil(127/16) = 8 pages, one plan's 128 pages, 16 + 1 spare.
    assert_eq!(groups[0].total_pages, 16 * 8 + 128 + 17);
    assert_eq!(
        ModelSpec::preset("gpt-oss-120b")
            .unwrap()
            .window
            .unwrap()
            .layers,
        18
    );
}

#[test]
fn deepseek_v4_builds_the_reference_groups() {
    let s = ModelSpec::preset("deepseek-v4-flash").unwrap();
    assert_eq!(s.page_size, Some(256));
    assert!(s.kv.is_none());
    let ids: Vec<&str> = s.group_templates.iter().map(|g| g.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "v4.c128a.compressed_kv",
            "v4.c128a.compressor_state",
            "v4.c4a.compressed_kv",
            "v4.c4a.compressor_state",
            "v4.c4a.indexer_compressor_state",
            "v4.swa_kv",
        ]
    );
    let geometry: Vec<(u32, u32, Option<u32>, GroupRole)> = s
        .group_templates
        .iter()
        .map(|g| (g.rows_per_page, g.entry_stride_tokens, g.window(), g.role))
        .collect();
    assert_eq!(
        geometry,
        [
            (2, 128, None, GroupRole::History),
            (8, 1, Some(128), GroupRole::State),
            (64, 4, None, GroupRole::History),
            (4, 1, Some(8), GroupRole::State),
            (4, 1, Some(8), GroupRole::State),
            (64, 1, Some(128), GroupRole::State),
        ]
    );
    assert_eq!(
        &s.required_groups[..2],
        ["v4.c4a.compressed_kv", "v4.c128a.compressed_kv"]
    );
    // kvtier requires the state groups too (PR381), which opens the gate.
    assert_eq!(s.required_groups.len(), 6);
    assert_eq!(s.gate(256), MidflightGate::UNCAPPED);
}

/// The reference reads only the top-level `sliding_window`; kvtier falls back to
/// `text_config.sliding_window` (spec §6, Codex P2, never fixed there).
#[test]
fn the_window_falls_back_to_text_config() {
    let v4 = |window: &str| {
        format!(
            r#"{{"model_type": "deepseek_v4", "num_hidden_layers": 2, "num_attention_heads": 4,
                "head_dim": 64, "qk_rope_head_dim": 16, "max_position_embeddings": 4096,
                "compress_ratios": [4, 128], {window}}}"#
        )
    };
    let nested = spec(&v4(r#""text_config": {"sliding_window": 96}"#)).unwrap();
    let swa = nested
        .group_templates
        .iter()
        .find(|g| g.id == "v4.swa_kv")
        .unwrap();
    assert_eq!(swa.window(), Some(96));
    let top = spec(&v4(
        r#""sliding_window": 64, "text_config": {"sliding_window": 96}"#,
    ))
    .unwrap();
    let swa = top
        .group_templates
        .iter()
        .find(|g| g.id == "v4.swa_kv")
        .unwrap();
    assert_eq!(swa.window(), Some(64), "the top level wins");
    let missing = spec(&v4(r#""text_config": {}"#)).unwrap_err().to_string();
    assert!(missing.contains("sliding_window"), "{missing}");
    // A multimodal wrapper: the language model's fields nested, the window with them.
    let wrapped = spec(
        r#"{"model_type": "mistral", "max_position_embeddings": 4096,
            "text_config": {"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 8,
                            "max_position_embeddings": 4096, "sliding_window": 32}}"#,
    );
    // max_position_embeddings is read from the language model's fields.
    let wrapped = wrapped.unwrap();
    assert_eq!(wrapped.cache_shape, CacheShape::PlainWindow { window: 32 });
}

#[test]
fn mamba_hybrids_get_the_state_family() {
    let nano = ModelSpec::preset("nemotron-nano-9b-v2").unwrap();
    let state = nano.state.unwrap();
    assert_eq!(state.layers, 27);
    // (conv 12288 × 3 bf16 + SSM 128 × 80 × 128 fp32) × 27 layers.
    assert_eq!(state.bytes_per_request, 143_548_416);
    assert_eq!(state.checkpoint_chunk, 64);
    assert_eq!(nano.kv.unwrap().layers, 4);
    assert_eq!(
        nano.kv.unwrap().head_dim,
        128,
        "head_dim, not hidden / heads = 112"
    );
    let next = ModelSpec::preset("qwen3-next-80b-a3b").unwrap();
    assert_eq!(next.state.unwrap().layers, 36);
    assert_eq!(next.state.unwrap().bytes_per_request, 77_266_944);
    assert_eq!(next.kv.unwrap().layers, 12);
    assert_eq!(next.gate(64), MidflightGate::UNCAPPED);
    let moe = ModelSpec::preset("nemotron-3-nano-30b-a3b").unwrap();
    assert_eq!((moe.state.unwrap().layers, moe.kv.unwrap().layers), (23, 6));
}

#[test]
fn bad_configs_name_what_is_wrong() {
    let cases = [
        ("[1, 2]", "not a JSON object"),
        ("{", "not a JSON object"),
        (r#"{"model_type": "bert"}"#, "`bert`"),
        (r#"{"num_hidden_layers": 2}"#, "no model_type"),
        (
            r#"{"model_type": "llama", "max_position_embeddings": 8}"#,
            "`num_hidden_layers`",
        ),
        (
            r#"{"model_type": "llama", "max_position_embeddings": 8, "num_hidden_layers": 2,
                "num_attention_heads": 4}"#,
            "`hidden_size`",
        ),
        (
            r#"{"model_type": "llama", "max_position_embeddings": 8, "num_hidden_layers": -2}"#,
            "`num_hidden_layers` is -2",
        ),
        (
            r#"{"model_type": "llama", "max_position_embeddings": 8, "num_hidden_layers": 2,
                "num_attention_heads": 4, "head_dim": 8, "torch_dtype": "int3"}"#,
            "unknown dtype `int3`",
        ),
        (
            r#"{"model_type": "nemotron_h", "max_position_embeddings": 8, "num_hidden_layers": 3,
                "hybrid_override_pattern": "M*"}"#,
            "2 letters for 3 layers",
        ),
        (
            r#"{"model_type": "gpt_oss", "max_position_embeddings": 8, "num_hidden_layers": 2,
                "num_attention_heads": 4, "head_dim": 8,
                "layer_types": ["sliding_attention", "full_attention"]}"#,
            "`sliding_window`",
        ),
        (
            r#"{"model_type": "deepseek_v4", "max_position_embeddings": 8, "num_hidden_layers": 2,
                "head_dim": 8, "qk_rope_head_dim": 4, "sliding_window": 8,
                "compress_ratios": [4, 16]}"#,
            "holds 16",
        ),
    ];
    for (json, expected) in cases {
        let err = spec(json).unwrap_err().to_string();
        assert!(err.contains(expected), "{json}: {err}");
    }
    let missing = ModelSpec::from_config_file(std::path::Path::new("/nonexistent/config.json"));
    assert!(matches!(missing, Err(ModelError::Io { .. })));
}
