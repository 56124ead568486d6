//! The virtual clock's cost model: what a step of the engine costs.

/// The virtual clock: what one engine step costs. Defaults model a Llama-3-8B-class model
/// (bf16 KV, 128 KiB per token) on one modern GPU; every field can be changed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Fixed cost of a step (launch, sampling), µs.
    pub step_us: f64,
    /// Prefill cost per computed prompt token, µs.
    pub prefill_us_per_token: f64,
    /// Decode cost per row, µs.
    pub decode_us_per_row: f64,
    /// KV bytes of one token across all layers of the modelled model.
    pub kv_bytes_per_token: f64,
    /// Host→device bandwidth, GB/s. Load-backs are on the critical path: the forward
    /// waits for them. Write-backs overlap with compute and cost nothing here.
    pub h2d_gbps: f64,
    /// L3→host bandwidth, GB/s. A prefetch holds its request back for its transfer
    /// time; backups overlap with compute and cost nothing here.
    pub l3_gbps: f64,
}

impl Default for CostModel {
    fn default() -> Self {
        Self {
            step_us: 4000.0,
            prefill_us_per_token: 40.0,
            decode_us_per_row: 60.0,
            kv_bytes_per_token: 131_072.0,
            h2d_gbps: 25.0,
            l3_gbps: 10.0,
        }
    }
}

/// The work of one step that the cost model prices.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepWork {
    /// Prompt tokens computed.
    pub prefill_tokens: u64,
    /// Decode rows.
    pub decode_rows: u64,
    /// Tokens whose KV is loaded back from host to device.
    pub loaded_tokens: u64,
    /// Tokens whose KV is prefetched from L3 into host.
    pub prefetched_tokens: u64,
}

impl CostModel {
    /// Virtual µs of one step.
    pub fn step_cost(&self, work: StepWork) -> f64 {
        let transfer_us =
            |tokens: u64, gbps: f64| tokens as f64 * self.kv_bytes_per_token / (gbps * 1e3);
        self.step_us
            + work.prefill_tokens as f64 * self.prefill_us_per_token
            + work.decode_rows as f64 * self.decode_us_per_row
            + transfer_us(work.loaded_tokens, self.h2d_gbps)
            + transfer_us(work.prefetched_tokens, self.l3_gbps)
    }
}
