//! Scheduler configuration and its validation.
//!
//! Field names and meanings follow the reference scheduler's `SchedulerConfig` for
//! full-attention models (spec/fsm-scheduler.md §9). Where the reference leaves a field
//! at 0 and relies on the runtime to set it, the default here is the runtime's value
//! (page size 64, budget 8192, 160 slots); pool sizes have no sensible default and must
//! be set.

use crate::{Policy, TypesError};

/// Prefill/decode disaggregation role. Only `Fused` is served today; the variants exist
/// so that the state and event types already have room for the P and D flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// Prefill and decode on the same engine.
    #[default]
    Fused,
    /// Prefill node of a disaggregated pair.
    Prefill,
    /// Decode node of a disaggregated pair.
    Decode,
}

/// The recurrent-state (Mamba) side of a hybrid model (spec/hybrid-l3.md §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MambaSettings {
    /// Device state slots (the reference's `mamba_pool_total_chunks`); a request holds
    /// two while it runs.
    pub device_slots: u32,
    /// Host state slots for host copies (`mamba_l2_host_slots`); 0: no host copies.
    pub host_slots: u32,
    /// The scan kernel's chunk (`mamba_cache_chunk_size`, 64 in the reference's
    /// kernels): intermediate checkpoints and branching lengths are aligned to it.
    pub chunk: u32,
}

impl Default for MambaSettings {
    fn default() -> Self {
        Self {
            device_slots: 64,
            host_slots: 0,
            chunk: 64,
        }
    }
}

/// The paged-cache side of a window or compressed-state model (spec/hybrid-l3.md §2):
/// its page groups and the groups a reusable prefix needs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct PagedSettings {
    /// The groups (any order; the family keeps them in id byte order).
    pub groups: Vec<crate::GroupSpec>,
    /// The groups a prefix needs to be reused (the prefix-cache adjunct), the first one
    /// leading commits; at least one history group (the scheduler refuses a config
    /// without: transport-only groups are not served).
    pub required: Vec<String>,
}

impl PagedSettings {
    /// Whether every group slides: a prefix's entries are then only its last windows,
    /// which a first chunk can compute again from the tokens (a KV hit from host or L3
    /// needs no snapshot).
    pub fn windows_only(&self) -> bool {
        self.groups.iter().all(crate::GroupSpec::is_sliding)
    }

    /// The first group (in id order) whose pool can never hold a request of `tokens`
    /// tokens, with the pages it would need: a full-history group, or a required history
    /// group (its snapshots keep the request's committed prefix), holds them all; another
    /// sliding group, its largest op (chunks of `op_tokens`) with the window before it.
    /// Such a request would wait forever.
    pub fn short_group(&self, tokens: u32, op_tokens: u32) -> Option<(&crate::GroupSpec, u32)> {
        let mut groups: Vec<&crate::GroupSpec> = self.groups.iter().collect();
        groups.sort_by(|a, b| a.id.cmp(&b.id));
        groups.into_iter().find_map(|g| {
            // A required history group's snapshots keep every page of the running
            // request's own committed prefix, sliding or not.
            let keeps_all = g.role == crate::GroupRole::History && self.required.contains(&g.id);
            let need = match g.window() {
                _ if keeps_all => g.pages_for(tokens),
                None => g.pages_for(tokens),
                // The first chunk from 0; a later chunk with the window before it; a
                // decode step with its window.
                Some(w) => {
                    let first = g.pages_for(op_tokens.min(tokens));
                    let later = (tokens > op_tokens).then(|| {
                        let chunk = op_tokens.min(tokens - op_tokens);
                        g.pages_for((w - 1).saturating_add(chunk)) + 1
                    });
                    first.max(later.unwrap_or(0)).max(g.pages_for(w) + 1)
                }
            };
            (need > g.total_pages.saturating_sub(1)).then_some((g, need))
        })
    }
}

/// Everything the scheduler core needs to know about its pools and policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Tokens per KV page. Must be positive.
    pub page_size: u32,
    /// Device page pool size including the reserved page 0 (usable ids `1..device_pages`).
    pub device_pages: u32,
    /// Host page pool size including the reserved page 0; 0 or 1 means no host pool.
    pub host_pages: u32,
    /// Token budget of one plan (the chunked-prefill size).
    pub max_scheduled_tokens: u32,
    /// Maximum forward rows per plan, and the number of request-pool slots.
    pub max_batch_size: u32,
    /// Tokens per decode row (draft width with speculative decoding); also the slots
    /// a request reserves ahead of its next step.
    pub decode_input_tokens: u32,
    /// No finish write-back and no host-prefix reuse for new requests (retraction still
    /// uses the host pool).
    pub disable_l2_cache: bool,
    /// Page hashes are maintained on every cached node; enables L3 prefetch eligibility.
    pub enable_l3_storage: bool,
    /// Prefetch from L3 only when more than this many consecutive pages hit.
    pub prefetch_threshold: u32,
    /// Collect `BlockStored` / `BlockRemoved` events for `drain_kv_events`.
    pub enable_kv_cache_events: bool,
    /// Decode-first mixed batches instead of prefill-first rounds.
    pub enable_mixed_prefill_decode: bool,
    /// Disaggregation role.
    pub role: Role,
    /// Reuse-intent matches return nothing; recovery matches still walk the tree.
    pub disable_prefix_cache: bool,
    /// Publish a request's computed prompt pages into the tree during prefill, so
    /// concurrent requests with the same prefix reuse them (reference PR #381). On by
    /// default for full-attention models.
    pub publish_prefix_mid_flight: bool,
    /// Plain sliding-window models (every attention layer slides over `W` tokens in
    /// the ordinary KV cache; reference PR #381): publish at most this many pages of a
    /// request's prefix mid-flight (`floor(W / P)`: a sibling reusing a longer prefix
    /// would attend KV its window never covered), at prefill and at decode page
    /// crossings alike. `None`: no window, no cap. kvtier-paged's `MidflightGate`
    /// derives this and `publish_prefix_mid_flight` from a model's cache shape (a model
    /// flagged unsafe, W = 0, publishes nothing mid-flight).
    pub midflight_publish_max_pages: Option<u32>,
    /// Scheduling steps slower than this are recorded as a `slow_step` tracing event
    /// (tail-based: fast steps cost nothing). `None` records none.
    pub slow_step_threshold: Option<std::time::Duration>,
    /// Say why hits were lost: the cache remembers the pages it dropped (their block
    /// hashes, four times the pools' pages) and each admission counts the prompt's
    /// pages after its hit that were dropped or that L3 had and no prefetch brought
    /// (`SchedulerStats::lost_hit_tokens`, the request span's `kvtier.lost_hit.*`).
    /// Costs a hash per prompt page at admission and per dropped page; no decision
    /// reads it.
    pub track_lost_hits: bool,
    /// kvtier's decisions, or the reference's where they differ (conformance runs).
    pub policy: Policy,
    /// Hybrid models: the recurrent-state family. A hybrid model's prefixes are
    /// published when each chunk is committed (its next row is admitted) and at each
    /// decode page crossing, whatever `publish_prefix_mid_flight` says.
    pub mamba: Option<MambaSettings>,
    /// Window and compressed-state models: the paged-cache family's groups
    /// ([`PagedSettings`]).
    pub paged: Option<PagedSettings>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            page_size: 64,
            device_pages: 0,
            host_pages: 0,
            max_scheduled_tokens: 8192,
            max_batch_size: 160,
            decode_input_tokens: 1,
            disable_l2_cache: false,
            enable_l3_storage: false,
            prefetch_threshold: 4,
            enable_kv_cache_events: false,
            enable_mixed_prefill_decode: false,
            role: Role::Fused,
            disable_prefix_cache: false,
            publish_prefix_mid_flight: true,
            midflight_publish_max_pages: None,
            slow_step_threshold: Some(std::time::Duration::from_millis(1)),
            track_lost_hits: false,
            policy: Policy::Default,
            mamba: None,
            paged: None,
        }
    }
}

fn invalid(field: &'static str, problem: impl Into<String>) -> TypesError {
    TypesError::InvalidConfig {
        field,
        problem: problem.into(),
    }
}

impl SchedulerConfig {
    /// Usable device pages (page 0 is reserved).
    pub fn usable_device_pages(&self) -> u32 {
        self.device_pages.saturating_sub(1)
    }

    /// Usable host pages (page 0 is reserved).
    pub fn usable_host_pages(&self) -> u32 {
        self.host_pages.saturating_sub(1)
    }

    /// Whether finish write-back and host-prefix reuse are active.
    pub fn l2_enabled(&self) -> bool {
        !self.disable_l2_cache
    }

    /// Whether L3 prefetches can happen: the L3 tier, the prefix cache and the host tier
    /// are all on (prefetched pages land in host pages of the tree), and the model keeps
    /// no paged-cache groups but windows, which its first chunk computes again (other
    /// groups' pages do not go to L3 yet).
    pub fn l3_prefetch_enabled(&self) -> bool {
        self.enable_l3_storage
            && !self.disable_prefix_cache
            && self.l2_enabled()
            && self.paged.as_ref().is_none_or(PagedSettings::windows_only)
    }

    /// Whether a prompt of `tokens` tokens is looked up in L3 at submission: prefetch is
    /// on and the prompt has more full pages than the prefetch threshold (fewer could
    /// never be prefetched).
    pub fn wants_l3_lookup(&self, tokens: usize) -> bool {
        self.l3_prefetch_enabled()
            && crate::lookup_pages(tokens, self.page_size) > self.prefetch_threshold as usize
    }

    /// Checks every field and every combination the scheduler relies on.
    pub fn validate(&self) -> Result<(), TypesError> {
        if self.page_size == 0 {
            return Err(invalid("page_size", "must be positive"));
        }
        if self.device_pages < 2 {
            return Err(invalid(
                "device_pages",
                format!(
                    "is {}: needs at least 2 (page 0 is reserved)",
                    self.device_pages
                ),
            ));
        }
        if self.max_scheduled_tokens == 0 {
            return Err(invalid("max_scheduled_tokens", "must be positive"));
        }
        if self.max_batch_size == 0 {
            return Err(invalid("max_batch_size", "must be positive"));
        }
        if self.role != Role::Fused {
            return Err(invalid(
                "role",
                "prefill/decode disaggregation is not supported yet; use Role::Fused",
            ));
        }
        if self.l2_enabled() && self.host_pages < 2 {
            return Err(invalid(
                "host_pages",
                format!(
                    "is {} while the L2 cache is enabled: set disable_l2_cache or give the host pool at least 2 pages",
                    self.host_pages
                ),
            ));
        }
        if self.enable_l3_storage && self.host_pages < 2 {
            return Err(invalid(
                "enable_l3_storage",
                "needs a host pool of at least 2 pages",
            ));
        }
        if let Some(m) = &self.mamba {
            if m.device_slots < 2 {
                return Err(invalid(
                    "mamba.device_slots",
                    format!(
                        "is {}: a running request holds two state slots",
                        m.device_slots
                    ),
                ));
            }
            if m.chunk == 0 {
                return Err(invalid("mamba.chunk", "must be positive"));
            }
            if m.host_slots > 0 && !self.l2_enabled() {
                return Err(invalid(
                    "mamba.host_slots",
                    "host state copies need the L2 cache (disable_l2_cache is set)",
                ));
            }
        }
        if let Some(p) = &self.paged {
            if p.groups.is_empty() {
                return Err(invalid(
                    "paged.groups",
                    "are empty: name at least one group",
                ));
            }
            for g in &p.groups {
                g.validate()?;
            }
            let mut ids: Vec<&str> = p.groups.iter().map(|g| g.id.as_str()).collect();
            ids.sort_unstable();
            if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
                return Err(invalid("paged.groups", format!("name `{}` twice", w[0])));
            }
            if let Some(r) = p.required.iter().find(|r| !ids.contains(&r.as_str())) {
                return Err(invalid(
                    "paged.required",
                    format!("names unknown group `{r}`"),
                ));
            }
            if self.mamba.is_some() {
                return Err(invalid(
                    "paged",
                    "a model with both a Mamba family and paged groups is not served yet",
                ));
            }
        }
        // Page ids and token positions are u32 in plans; keep products representable.
        let device_tokens = u64::from(self.device_pages) * u64::from(self.page_size);
        if device_tokens > u64::from(u32::MAX) {
            return Err(invalid(
                "device_pages",
                "times page_size exceeds u32 token positions",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid() -> SchedulerConfig {
        SchedulerConfig {
            device_pages: 32,
            host_pages: 32,
            ..SchedulerConfig::default()
        }
    }

    #[test]
    fn default_with_pools_is_valid() {
        assert_eq!(valid().validate(), Ok(()));
    }

    #[test]
    fn default_without_pools_is_rejected() {
        let err = SchedulerConfig::default().validate().unwrap_err();
        assert!(err.to_string().contains("device_pages"), "{err}");
    }

    #[test]
    fn zero_and_inconsistent_values_are_rejected() {
        let cases: Vec<(SchedulerConfig, &str)> = vec![
            (
                SchedulerConfig {
                    page_size: 0,
                    ..valid()
                },
                "page_size",
            ),
            (
                SchedulerConfig {
                    device_pages: 1,
                    ..valid()
                },
                "device_pages",
            ),
            (
                SchedulerConfig {
                    max_scheduled_tokens: 0,
                    ..valid()
                },
                "max_scheduled_tokens",
            ),
            (
                SchedulerConfig {
                    max_batch_size: 0,
                    ..valid()
                },
                "max_batch_size",
            ),
            (
                SchedulerConfig {
                    host_pages: 1,
                    ..valid()
                },
                "host_pages",
            ),
            (
                SchedulerConfig {
                    host_pages: 0,
                    disable_l2_cache: true,
                    enable_l3_storage: true,
                    ..valid()
                },
                "enable_l3_storage",
            ),
            (
                SchedulerConfig {
                    role: Role::Decode,
                    ..valid()
                },
                "role",
            ),
            (
                SchedulerConfig {
                    page_size: 1 << 16,
                    device_pages: 1 << 17,
                    ..valid()
                },
                "device_pages",
            ),
        ];
        for (config, field) in cases {
            let err = config.validate().unwrap_err();
            assert!(err.to_string().contains(field), "{field}: {err}");
        }
    }

    #[test]
    fn l2_disabled_needs_no_host_pool() {
        let config = SchedulerConfig {
            host_pages: 0,
            disable_l2_cache: true,
            ..valid()
        };
        assert_eq!(config.validate(), Ok(()));
    }
}
