//! One derivation per architecture.

use kvtier_paged::{CacheShape, GroupRole, GroupSpec};
use serde_json::Value;

use crate::json::{Fields, dtype_size};
use crate::{KvShape, ModelError, ModelSpec, StateShape, WindowLayers};

/// The scan kernel's chunk of the Mamba and gated-delta-net kernels kvtier serves.
const STATE_CHUNK: u32 = 64;

/// DeepSeek-V4's KV page (`DEEPSEEK_V4_PAGE_SIZE`).
const V4_PAGE: u32 = 256;

pub(crate) fn derive(name: &str, root: &Value) -> Result<ModelSpec, ModelError> {
    let f = Fields::new(root)?;
    let mut spec = ModelSpec {
        name: name.to_owned(),
        model_type: f.model_type.clone(),
        context_len: f.positive("max_position_embeddings")?,
        page_size: None,
        kv: None,
        window: None,
        state: None,
        group_templates: Vec::new(),
        required_groups: Vec::new(),
        cache_shape: CacheShape::NoWindow,
    };
    match f.model_type.as_str() {
        "llama" | "mistral" | "qwen2" | "qwen3" => dense(&f, &mut spec)?,
        "gpt_oss" => gpt_oss(&f, &mut spec)?,
        "deepseek_v4" => deepseek_v4(&f, &mut spec)?,
        "qwen3_next" => qwen3_next(&f, &mut spec)?,
        "nemotron_h" => nemotron_h(&f, &mut spec)?,
        other => return Err(ModelError::UnknownArchitecture(other.to_owned())),
    }
    Ok(spec)
}

/// Per-layer KV geometry of the attention layers: `head_dim`, else
/// `attention_head_dim`, else `hidden_size / num_attention_heads` (the fallback is
/// wrong for many models, so a field that exists always wins).
fn attention_kv(f: &Fields<'_>, layers: u32) -> Result<KvShape, ModelError> {
    let heads = f.positive("num_attention_heads")?;
    let kv_heads = match f.opt_u32("num_key_value_heads")? {
        Some(0) => return Err(f.invalid("num_key_value_heads", "must be positive")),
        Some(n) => n,
        None => heads,
    };
    let head_dim = match (f.opt_u32("head_dim")?, f.opt_u32("attention_head_dim")?) {
        (Some(d), _) | (None, Some(d)) if d > 0 => d,
        (Some(_), _) | (None, Some(_)) => return Err(f.invalid("head_dim", "must be positive")),
        (None, None) => f.positive("hidden_size")? / heads,
    };
    Ok(KvShape {
        layers,
        planes: 2,
        kv_heads,
        head_dim,
        dtype_bytes: f.dtype_bytes(&["torch_dtype", "dtype"])?,
    })
}

/// Full attention, or every layer above `max_window_layers` sliding (Qwen) / every
/// layer sliding (Mistral).
fn dense(f: &Fields<'_>, spec: &mut ModelSpec) -> Result<(), ModelError> {
    let layers = f.positive("num_hidden_layers")?;
    let kv = attention_kv(f, layers)?;
    // Qwen files ship a `sliding_window` that means nothing unless
    // `use_sliding_window` is set (transformers drops it then).
    let window = match f.model_type.as_str() {
        "qwen2" | "qwen3" if f.bool("use_sliding_window") != Some(true) => None,
        _ => f.sliding_window()?.filter(|&w| w > 0),
    };
    let sliding = match (window, f.model_type.as_str()) {
        (None, _) => 0,
        (Some(_), "qwen2" | "qwen3") => {
            let from = f.opt_u32("max_window_layers")?.unwrap_or(layers);
            layers.saturating_sub(from)
        }
        (Some(_), _) => layers,
    };
    match window {
        Some(window) if sliding > 0 => {
            // Window layers beside full ones need their own group; a model whose every
            // layer slides keeps them in the main pool as plain window attention.
            if sliding < layers {
                spec.kv = Some(KvShape {
                    layers: layers - sliding,
                    ..kv
                });
                spec.window = Some(WindowLayers {
                    layers: sliding,
                    window,
                    kv: KvShape {
                        layers: sliding,
                        ..kv
                    },
                });
            } else {
                spec.kv = Some(kv);
            }
            spec.cache_shape = CacheShape::PlainWindow { window };
        }
        _ => spec.kv = Some(kv),
    }
    Ok(())
}

/// Alternating sliding and full layers (`layer_types`). Flagged unsafe to publish
/// mid-flight: attention sinks and mixed layers change answers on a prefix hit (GPQA
/// 0.71 to 0.547 in the reference's PR381).
fn gpt_oss(f: &Fields<'_>, spec: &mut ModelSpec) -> Result<(), ModelError> {
    let layers = f.positive("num_hidden_layers")?;
    let types = f
        .strings("layer_types")?
        .ok_or_else(|| f.missing("layer_types"))?;
    f.per_layer("layer_types", types.len(), layers, "entries")?;
    let mut sliding = 0;
    for t in &types {
        match *t {
            "sliding_attention" => sliding += 1,
            "full_attention" => {}
            other => return Err(f.invalid("layer_types", format!("names unknown layer `{other}`"))),
        }
    }
    let kv = attention_kv(f, layers - sliding)?;
    spec.kv = Some(kv);
    if sliding > 0 {
        let window = f
            .sliding_window()?
            .filter(|&w| w > 0)
            .ok_or_else(|| f.invalid("sliding_window", "must be positive with sliding layers"))?;
        spec.window = Some(WindowLayers {
            layers: sliding,
            window,
            kv: KvShape {
                layers: sliding,
                ..kv
            },
        });
    }
    spec.cache_shape = CacheShape::PlainWindow { window: 0 };
    Ok(())
}

/// DeepSeek-V4: every layer has sliding-window KV; layers compressed by 4 or 128 also
/// keep compressed KV and a compressor state, and the ratio-4 layers an indexer state
/// (spec/hybrid-l3.md §2.1). All of it lives in paged groups. The required groups are
/// the history groups and, unlike the reference at 350cf505, the state groups too
/// (PR381): a prefix is then reusable at any snapshot whose windows are complete, not
/// only at a terminal continuation.
fn deepseek_v4(f: &Fields<'_>, spec: &mut ModelSpec) -> Result<(), ModelError> {
    let layers =
        f.positive("num_hidden_layers")? + f.opt_u32("num_nextn_predict_layers")?.unwrap_or(0);
    f.positive("head_dim")?;
    f.positive("qk_rope_head_dim")?;
    let window = f
        .sliding_window()?
        .ok_or_else(|| f.missing("sliding_window (or text_config.sliding_window)"))?;
    if window == 0 {
        return Err(f.invalid("sliding_window", "must be positive"));
    }
    let ratios = f.integers("compress_ratios")?;
    if ratios.len() < layers as usize {
        return Err(f.invalid(
            "compress_ratios",
            format!(
                "has {} entries for {layers} layers (with the MTP layers)",
                ratios.len()
            ),
        ));
    }
    let ratios = &ratios[..layers as usize];
    if let Some(r) = ratios.iter().find(|r| ![0, 1, 4, 128].contains(*r)) {
        return Err(f.invalid(
            "compress_ratios",
            format!("holds {r}; kvtier knows 0, 1, 4 and 128"),
        ));
    }
    // The c4 compressor state spans 8 tokens at one decode token per step.
    const C4_WINDOW: u32 = 8;
    let mut groups = vec![GroupSpec::sliding(
        "v4.swa_kv",
        64,
        1,
        0,
        window,
        GroupRole::State,
    )];
    if ratios.contains(&4) {
        groups.push(GroupSpec::sliding(
            "v4.c4a.compressor_state",
            4,
            1,
            0,
            C4_WINDOW,
            GroupRole::State,
        ));
        groups.push(GroupSpec::full_history(
            "v4.c4a.compressed_kv",
            V4_PAGE / 4,
            4,
            0,
        ));
        groups.push(GroupSpec::sliding(
            "v4.c4a.indexer_compressor_state",
            4,
            1,
            0,
            C4_WINDOW,
            GroupRole::State,
        ));
    }
    if ratios.contains(&128) {
        groups.push(GroupSpec::sliding(
            "v4.c128a.compressor_state",
            8,
            1,
            0,
            128,
            GroupRole::State,
        ));
        groups.push(GroupSpec::full_history(
            "v4.c128a.compressed_kv",
            V4_PAGE / 128,
            128,
            0,
        ));
    }
    groups.sort_by(|a, b| a.id.cmp(&b.id));
    // History groups first (c4 before c128, the reference's order), then the states.
    let mut required: Vec<String> = ["v4.c4a.compressed_kv", "v4.c128a.compressed_kv"]
        .into_iter()
        .filter(|id| groups.iter().any(|g| g.id == *id))
        .map(str::to_owned)
        .collect();
    required.extend(
        groups
            .iter()
            .filter(|g| g.role == GroupRole::State)
            .map(|g| g.id.clone()),
    );
    spec.page_size = Some(V4_PAGE);
    spec.required_groups = required;
    spec.cache_shape = CacheShape::PagedHybrid {
        adjunct: true,
        required_sliding_state: true,
    };
    spec.group_templates = groups;
    Ok(())
}

/// Bytes of the SSM state's dtype: `mamba_ssm_cache_dtype`, float32 by default.
fn ssm_dtype_bytes(f: &Fields<'_>) -> Result<u32, ModelError> {
    match f.str("mamba_ssm_cache_dtype") {
        None => Ok(4),
        Some(name) => dtype_size(name).ok_or_else(|| {
            f.invalid(
                "mamba_ssm_cache_dtype",
                format!("names an unknown dtype `{name}`"),
            )
        }),
    }
}

/// Qwen3-Next: gated-delta-net layers beside full attention every
/// `full_attention_interval` layers (or as `layer_types` says).
fn qwen3_next(f: &Fields<'_>, spec: &mut ModelSpec) -> Result<(), ModelError> {
    let layers = f.positive("num_hidden_layers")?;
    let full = match f.strings("layer_types")? {
        Some(types) => {
            f.per_layer("layer_types", types.len(), layers, "entries")?;
            types.iter().filter(|t| **t == "full_attention").count() as u32
        }
        None => layers / f.positive("full_attention_interval")?,
    };
    let key_heads = f.positive("linear_num_key_heads")?;
    let value_heads = f.positive("linear_num_value_heads")?;
    let key_dim = f.positive("linear_key_head_dim")?;
    let value_dim = f.positive("linear_value_head_dim")?;
    let conv_kernel = f.positive("linear_conv_kernel_dim")?;
    let dtype = f.dtype_bytes(&["torch_dtype", "dtype"])?;
    let conv_dim = 2 * u64::from(key_dim * key_heads) + u64::from(value_dim * value_heads);
    let conv = conv_dim * u64::from(conv_kernel - 1) * u64::from(dtype);
    let ssm = u64::from(value_heads) * u64::from(value_dim) * u64::from(key_dim) * 4;
    let recurrent = layers - full;
    spec.kv = Some(attention_kv(f, full)?);
    spec.state = Some(StateShape {
        layers: recurrent,
        bytes_per_request: u64::from(recurrent) * (conv + ssm),
        checkpoint_chunk: STATE_CHUNK,
    });
    Ok(())
}

/// Nemotron-H: `hybrid_override_pattern` has one letter per layer: `M` Mamba2, `*`
/// attention, `-` MLP, `E` MoE.
fn nemotron_h(f: &Fields<'_>, spec: &mut ModelSpec) -> Result<(), ModelError> {
    let layers = f.positive("num_hidden_layers")?;
    let pattern = f
        .str("hybrid_override_pattern")
        .ok_or_else(|| f.missing("hybrid_override_pattern"))?;
    f.per_layer("hybrid_override_pattern", pattern.len(), layers, "letters")?;
    let (mut mamba, mut attention) = (0u32, 0u32);
    for c in pattern.chars() {
        match c {
            'M' => mamba += 1,
            '*' => attention += 1,
            '-' | 'E' => {}
            other => {
                return Err(f.invalid(
                    "hybrid_override_pattern",
                    format!("holds `{other}`; kvtier knows M, *, - and E"),
                ));
            }
        }
    }
    let heads = u64::from(f.positive("mamba_num_heads")?);
    let head_dim = u64::from(f.positive("mamba_head_dim")?);
    let state = u64::from(f.positive("ssm_state_size")?);
    let groups = u64::from(f.positive("n_groups")?);
    let conv_kernel = u64::from(f.positive("conv_kernel")?);
    let dtype = u64::from(f.dtype_bytes(&["torch_dtype", "dtype"])?);
    let inner = heads * head_dim;
    let conv = (inner + 2 * groups * state) * (conv_kernel - 1) * dtype;
    let ssm = inner * state * u64::from(ssm_dtype_bytes(f)?);
    spec.kv = Some(attention_kv(f, attention)?);
    spec.state = Some(StateShape {
        layers: mamba,
        bytes_per_request: u64::from(mamba) * (conv + ssm),
        checkpoint_chunk: STATE_CHUNK,
    });
    Ok(())
}
