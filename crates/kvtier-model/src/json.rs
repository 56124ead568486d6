//! Reading fields of a `config.json`, with errors that name the field.

use serde_json::Value;

use crate::ModelError;

/// The fields of one config: the language model's own (under `text_config` for
/// multimodal wrappers) and the root's.
#[derive(Debug)]
pub(crate) struct Fields<'a> {
    pub model_type: String,
    root: &'a Value,
    lm: &'a Value,
}

impl<'a> Fields<'a> {
    pub fn new(root: &'a Value) -> Result<Self, ModelError> {
        if !root.is_object() {
            return Err(ModelError::Json("the top level is not an object".into()));
        }
        // Multimodal wrappers keep the language model's fields in `text_config`.
        let lm = match root.get("text_config") {
            Some(text) if text.is_object() && root.get("num_attention_heads").is_none() => text,
            _ => root,
        };
        let model_type = root
            .get("model_type")
            .or_else(|| lm.get("model_type"))
            .and_then(Value::as_str)
            .ok_or_else(|| ModelError::UnknownArchitecture("(no model_type)".into()))?
            .to_owned();
        Ok(Self {
            model_type,
            root,
            lm,
        })
    }

    pub fn missing(&self, field: &str) -> ModelError {
        ModelError::MissingField {
            model_type: self.model_type.clone(),
            field: field.to_owned(),
        }
    }

    /// Checks that a per-layer field (`what`: entries, letters) covers every layer.
    pub fn per_layer(
        &self,
        field: &str,
        len: usize,
        layers: u32,
        what: &str,
    ) -> Result<(), ModelError> {
        if len == layers as usize {
            return Ok(());
        }
        Err(self.invalid(field, format!("has {len} {what} for {layers} layers")))
    }

    pub fn invalid(&self, field: &str, problem: impl Into<String>) -> ModelError {
        ModelError::InvalidField {
            model_type: self.model_type.clone(),
            field: field.to_owned(),
            problem: problem.into(),
        }
    }

    fn get(&self, field: &str) -> Option<&'a Value> {
        self.lm.get(field).filter(|v| !v.is_null())
    }

    fn as_u32(&self, field: &str, v: &Value) -> Result<u32, ModelError> {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| self.invalid(field, format!("is {v}, not a non-negative integer")))
    }

    /// A required non-negative integer.
    pub fn u32(&self, field: &str) -> Result<u32, ModelError> {
        let v = self.get(field).ok_or_else(|| self.missing(field))?;
        self.as_u32(field, v)
    }

    /// A required positive integer.
    pub fn positive(&self, field: &str) -> Result<u32, ModelError> {
        match self.u32(field)? {
            0 => Err(self.invalid(field, "must be positive")),
            n => Ok(n),
        }
    }

    /// An optional non-negative integer (absent or null: `None`).
    pub fn opt_u32(&self, field: &str) -> Result<Option<u32>, ModelError> {
        self.get(field).map(|v| self.as_u32(field, v)).transpose()
    }

    pub fn str(&self, field: &str) -> Option<&'a str> {
        self.get(field).and_then(Value::as_str)
    }

    pub fn bool(&self, field: &str) -> Option<bool> {
        self.get(field).and_then(Value::as_bool)
    }

    /// A required array of strings.
    pub fn strings(&self, field: &str) -> Result<Option<Vec<&'a str>>, ModelError> {
        let Some(v) = self.get(field) else {
            return Ok(None);
        };
        let items = v
            .as_array()
            .ok_or_else(|| self.invalid(field, "is not an array"))?;
        items
            .iter()
            .map(|s| {
                s.as_str()
                    .ok_or_else(|| self.invalid(field, "holds a non-string"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// An array of non-negative integers.
    pub fn integers(&self, field: &str) -> Result<Vec<u32>, ModelError> {
        let v = self.get(field).ok_or_else(|| self.missing(field))?;
        let items = v
            .as_array()
            .ok_or_else(|| self.invalid(field, "is not an array"))?;
        items.iter().map(|x| self.as_u32(field, x)).collect()
    }

    /// Bytes per element of the model's dtype (`torch_dtype`, or `dtype` in newer
    /// files); bf16 when the config names none (gpt-oss: the server decides).
    pub fn dtype_bytes(&self, field_names: &[&str]) -> Result<u32, ModelError> {
        let Some((field, name)) = field_names
            .iter()
            .find_map(|f| self.str(f).map(|name| (*f, name)))
        else {
            return Ok(2);
        };
        dtype_size(name)
            .ok_or_else(|| self.invalid(field, format!("names an unknown dtype `{name}`")))
    }

    /// The model's sliding window: `sliding_window`, falling back to
    /// `text_config.sliding_window` (the reference's Python never added the fallback;
    /// multimodal wrappers keep it nested). `None` when neither is set.
    pub fn sliding_window(&self) -> Result<Option<u32>, ModelError> {
        let top = self.root.get("sliding_window").filter(|v| !v.is_null());
        let nested = self
            .root
            .get("text_config")
            .and_then(|t| t.get("sliding_window"))
            .filter(|v| !v.is_null());
        match (top, nested) {
            (Some(v), _) => self.as_u32("sliding_window", v).map(Some),
            (None, Some(v)) => self.as_u32("text_config.sliding_window", v).map(Some),
            (None, None) => Ok(None),
        }
    }
}

/// Bytes per element of a dtype name.
pub(crate) fn dtype_size(name: &str) -> Option<u32> {
    Some(match name {
        "float32" | "fp32" => 4,
        "bfloat16" | "float16" | "half" | "bf16" | "fp16" => 2,
        "float8_e4m3fn" | "float8_e5m2" | "fp8" => 1,
        _ => return None,
    })
}
