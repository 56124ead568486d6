//! What the campaign reached: per run, how often each path of interest happened; per
//! campaign, in how many runs and how often in all.

use std::collections::BTreeMap;

use kvtier_fsm::StateKind;
use serde::Serialize;

use super::faults::FaultKind;
use super::spec::ABORT_STATES;

/// The scheduler's and the data plane's paths, in table order (client aborts and faults
/// follow them).
pub const PATHS: [&str; 18] = [
    "prefix hit",
    "host hit (load-back)",
    "load-back on recovery",
    "load-back failed, readers requeued",
    "retraction",
    "recompute (host full, or deadlock)",
    "device eviction",
    "host eviction",
    "finish write-back",
    "L3 lookup hit (pages)",
    "L3 prefetch",
    "L3 partial prefetch",
    "L3 failed prefetch",
    "L3 backup",
    "L3 failed backup",
    "submit refused (prompt too long)",
    "scheduler abort: exceeds device pool",
    "stale events ignored",
];

/// The name of a client abort in `state`.
pub fn client_abort(state: StateKind) -> String {
    format!("client abort: {state:?}")
}

/// Every metric, in table order.
pub fn metric_names() -> Vec<String> {
    PATHS
        .iter()
        .map(|name| name.to_string())
        .chain(
            ABORT_STATES
                .iter()
                .map(|&(state, _, _)| client_abort(state)),
        )
        .chain(FaultKind::ALL.iter().map(|kind| kind.name().to_string()))
        .collect()
}

/// How often each metric happened in one run (metrics that never did are absent).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Coverage(pub BTreeMap<String, u64>);

impl Coverage {
    /// Counts `n` more of `metric` (nothing when `n` is 0).
    pub fn add(&mut self, metric: &str, n: u64) {
        if n > 0 {
            *self.0.entry(metric.to_string()).or_default() += n;
        }
    }

    /// How often `metric` happened.
    pub fn get(&self, metric: &str) -> u64 {
        self.0.get(metric).copied().unwrap_or(0)
    }
}

/// One line of the campaign's coverage table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CoverageRow {
    /// The metric.
    pub metric: String,
    /// Runs (seeds) in which it happened.
    pub runs: u64,
    /// How often it happened in all.
    pub total: u64,
}

/// The campaign's table: every metric, reached or not, in table order.
pub fn table<'a>(runs: impl IntoIterator<Item = &'a Coverage>) -> Vec<CoverageRow> {
    let mut rows: Vec<CoverageRow> = metric_names()
        .into_iter()
        .map(|metric| CoverageRow {
            metric,
            runs: 0,
            total: 0,
        })
        .collect();
    let mut index: BTreeMap<String, usize> = rows
        .iter()
        .enumerate()
        .map(|(i, row)| (row.metric.clone(), i))
        .collect();
    for run in runs {
        for (metric, &n) in &run.0 {
            // A metric the table does not list yet still shows, at the end.
            let i = *index.entry(metric.clone()).or_insert_with(|| {
                rows.push(CoverageRow {
                    metric: metric.clone(),
                    runs: 0,
                    total: 0,
                });
                rows.len() - 1
            });
            rows[i].runs += 1;
            rows[i].total += n;
        }
    }
    rows
}
