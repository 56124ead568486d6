//! The replay's config file (`--config`): every field optional, each a flag's value.

use std::fmt;
use std::marker::PhantomData;

use anyhow::{Context, Result, bail};
use clap::ValueEnum;
use kvtier_sim::oracle::Verify;
use kvtier_sim::scenario::{CostModel, L3Store};
use serde::de::{self, Deserializer, EnumAccess, VariantAccess, Visitor};

use super::*;

/// A replay config file (`--config`); every field is optional. See
/// docs/replay.example.toml.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReplayFile {
    #[serde(default, deserialize_with = "by_name")]
    pub(super) workload: Option<ReplayWorkload>,
    pub(super) model: Option<String>,
    pub(super) model_config: Option<std::path::PathBuf>,
    pub(super) cache: Option<bool>,
    pub(super) publish: Option<bool>,
    #[serde(default, deserialize_with = "by_name")]
    pub(super) verify: Option<Verify>,
    pub(super) fail_every_nth_write_back: Option<u64>,
    pub(super) fail_every_nth_load_back: Option<u64>,
    #[serde(default, deserialize_with = "by_name")]
    pub(super) l3: Option<L3Store>,
    pub(super) l3_dir: Option<std::path::PathBuf>,
    pub(super) cost: Option<CostFile>,
}

/// A config value named as on the command line. It is read the way serde reads a unit
/// enum variant, so the file takes exactly the flags' words and a bad one is refused as
/// any unknown variant is.
fn by_name<'de, D: Deserializer<'de>, T: ValueEnum>(d: D) -> Result<Option<T>, D::Error> {
    struct Name<T>(PhantomData<T>);
    impl<'de, T: ValueEnum> Visitor<'de> for Name<T> {
        type Value = T;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a name")
        }

        fn visit_enum<A: EnumAccess<'de>>(self, data: A) -> Result<T, A::Error> {
            let (name, variant): (String, _) = data.variant()?;
            variant.unit_variant()?;
            T::from_str(&name, false).map_err(|_| {
                let names: Vec<String> = T::value_variants()
                    .iter()
                    .filter_map(|v| Some(format!("`{}`", v.to_possible_value()?.get_name())))
                    .collect();
                de::Error::custom(format_args!(
                    "unknown variant `{name}`, expected one of {}",
                    names.join(", ")
                ))
            })
        }
    }
    d.deserialize_enum("", &[], Name(PhantomData)).map(Some)
}

/// The virtual clock's cost model; unset fields keep their defaults.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CostFile {
    pub(super) step_us: Option<f64>,
    pub(super) prefill_us_per_token: Option<f64>,
    pub(super) decode_us_per_row: Option<f64>,
    pub(super) kv_bytes_per_token: Option<f64>,
    pub(super) h2d_gbps: Option<f64>,
    pub(super) l3_gbps: Option<f64>,
}

impl CostFile {
    pub(super) fn apply(&self, mut cost: CostModel) -> Result<CostModel> {
        let fields = [
            ("step_us", self.step_us, &mut cost.step_us),
            (
                "prefill_us_per_token",
                self.prefill_us_per_token,
                &mut cost.prefill_us_per_token,
            ),
            (
                "decode_us_per_row",
                self.decode_us_per_row,
                &mut cost.decode_us_per_row,
            ),
            (
                "kv_bytes_per_token",
                self.kv_bytes_per_token,
                &mut cost.kv_bytes_per_token,
            ),
        ];
        for (name, value, slot) in fields {
            if let Some(v) = value {
                if !(v.is_finite() && v >= 0.0) {
                    bail!("cost.{name} must be a finite number ≥ 0, got {v}");
                }
                *slot = v;
            }
        }
        let bandwidths = [
            ("h2d_gbps", self.h2d_gbps, &mut cost.h2d_gbps),
            ("l3_gbps", self.l3_gbps, &mut cost.l3_gbps),
        ];
        for (name, value, slot) in bandwidths {
            if let Some(v) = value {
                if !(v.is_finite() && v > 0.0) {
                    bail!("cost.{name} must be a finite number > 0, got {v}");
                }
                *slot = v;
            }
        }
        Ok(cost)
    }
}

pub(super) fn read_replay_file(path: &std::path::Path) -> Result<ReplayFile> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("invalid replay config {}", path.display()))
}
