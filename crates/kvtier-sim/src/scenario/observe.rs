//! What a scenario exports as it runs: metrics, KV events, the timeline.

use std::sync::Arc;

use kvtier::KvError;
use kvtier_types::Token;
use serde::Serialize;

use super::*;

/// Steps between refreshes of a run's metrics text.
pub const METRICS_EVERY: u64 = 64;

/// Something told the system's stats at every refresh, with the virtual clock (s).
pub type StatsObserver = Arc<dyn Fn(f64, &kvtier::SystemStats) + Send + Sync>;

/// What a run does with its system's stats every [`METRICS_EVERY`] steps and at the end:
/// keeps them as Prometheus text, and tells each observer (an OpenTelemetry export,
/// say). Options compare it by identity.
#[derive(Clone, Default)]
pub struct MetricsSink {
    /// The latest Prometheus text.
    pub text: kvtier::metrics::MetricsText,
    /// Told the stats after the text is written.
    pub observers: Vec<StatsObserver>,
}

impl std::fmt::Debug for MetricsSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsSink")
            .field("observers", &self.observers.len())
            .finish_non_exhaustive()
    }
}

impl PartialEq for MetricsSink {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.text, &other.text)
    }
}

impl Eq for MetricsSink {}

impl MetricsSink {
    /// Also exports the stats as OpenTelemetry metrics through `telemetry`'s meter.
    pub fn exporting(mut self, telemetry: &kvtier::telemetry::Telemetry) -> Self {
        let export = std::sync::Mutex::new(kvtier::telemetry::MetricsExport::new(telemetry));
        self.observers.push(Arc::new(move |_, stats| {
            if let Ok(mut export) = export.lock() {
                export.update(stats);
            }
        }));
        self
    }
}

/// The run's counters at one moment of the virtual clock (`--report`'s plots).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TimelinePoint {
    /// The virtual clock, s.
    pub virtual_s: f64,
    /// Prompt tokens queried so far (each request's at its first chunk).
    pub queried_tokens: u64,
    /// Of those, the tokens each tier supplied: device, host, L3.
    pub hit_tokens: [u64; 3],
    /// Pages the prefix cache holds: device, host.
    pub cached_pages: [u64; 2],
    /// Free pages: device, host.
    pub free_pages: [u64; 2],
    /// Requests running and waiting.
    pub requests: [u64; 2],
    /// Bytes prefetched from and backed up to L3 so far.
    pub l3_prefetched_bytes: u64,
    /// Bytes backed up to L3 so far.
    pub l3_backed_up_bytes: u64,
}

impl TimelinePoint {
    fn of(virtual_s: f64, stats: &kvtier::SystemStats) -> Self {
        let s = &stats.scheduler;
        Self {
            virtual_s,
            queried_tokens: s.prompt_query_tokens,
            hit_tokens: [
                s.hit_tokens.saturating_sub(s.hit_tokens_host),
                s.hit_tokens_host.saturating_sub(s.hit_tokens_l3),
                s.hit_tokens_l3,
            ],
            cached_pages: [s.cached_device_pages, s.cached_host_pages],
            free_pages: [
                u64::from(s.available_device_pages),
                u64::from(s.available_host_pages),
            ],
            requests: [
                (s.prefilling + s.decoding) as u64,
                (s.waiting + s.looking_up + s.retracted) as u64,
            ],
            l3_prefetched_bytes: stats.l3.map_or(0, |l3| l3.prefetched_bytes),
            l3_backed_up_bytes: stats.l3.map_or(0, |l3| l3.backed_up_bytes),
        }
    }
}

/// Where a run publishes its KV events (options compare it by identity).
#[derive(Debug, Clone)]
pub struct KvEventsSink(pub Arc<kvtier::kv_publisher::KvEventPublisher>);

impl PartialEq for KvEventsSink {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for KvEventsSink {}

/// Publishes the KV events of the system since the last call as one batch stamped
/// `now_us` on the virtual clock.
pub(super) fn publish_kv_events(
    s: &mut kvtier::LocalSystem,
    sink: &KvEventsSink,
    now_us: f64,
) -> Result<(), ScenarioError> {
    let events = s.take_kv_events()?;
    sink.publish(now_us / 1e6, &events);
    Ok(())
}

impl KvEventsSink {
    /// Publishes `events` as one batch stamped `ts` (nothing when there are none).
    pub fn publish(&self, ts: f64, events: &[kvtier_types::KvEvent]) {
        if !events.is_empty() {
            let wired: Vec<_> = events
                .iter()
                .map(kvtier::vllm_events::WireEvent::Cache)
                .collect();
            self.0.publish(ts, &wired);
        }
    }
}

/// Each of `requests`' prompts' cached prefix per tier now: the radix cache's probe
/// (read-only) and, with an L3 store, its lookup.
pub(super) fn prefix_residency(
    s: &mut kvtier::LocalSystem,
    requests: &[crate::trace::TraceRequest],
) -> Result<Vec<PrefixResidency>, ScenarioError> {
    let prompts: Vec<Arc<Vec<Token>>> = requests.iter().map(|q| Arc::new(q.prompt())).collect();
    let stored =
        match s.ask::<kvtier_l3::L3Core>(kvtier_l3::L3Msg::L3Lookup(kvtier_types::LookupAsk {
            ticket: 0,
            prompts: prompts.clone(),
        })) {
            Ok(kvtier_l3::L3Reply::L3LookedUp { hit_pages, .. }) => hit_pages,
            Ok(_) | Err(KvError::NoActor(_)) => vec![0; prompts.len()],
            Err(e) => return Err(e.into()),
        };
    let page = u64::from(SCENARIO_PAGE_SIZE);
    let mut out = Vec::with_capacity(prompts.len());
    for ((request, prompt), stored) in requests.iter().zip(prompts).zip(stored) {
        let probe = match s
            .ask::<kvtier_radix::RadixCore>(kvtier_radix::RadixMsg::Probe(prompt.to_vec()))?
        {
            kvtier_radix::RadixReply::Probed(probe) => probe,
            _ => kvtier_radix::Probe::default(),
        };
        out.push(PrefixResidency {
            request_id: format!("t{:06}", request.line),
            token_ids: prompt.to_vec(),
            device_tokens: u64::from(probe.device_pages) * page,
            host_tokens: u64::from(probe.host_pages) * page,
            storage_tokens: u64::from(stored) * page,
        });
    }
    Ok(out)
}

/// Reads the system's stats at `now_us` on the virtual clock into `metrics` (its text
/// and observers) and, when one is kept, the timeline.
pub(crate) fn refresh_metrics(
    s: &mut kvtier::LocalSystem,
    metrics: Option<&MetricsSink>,
    timeline: Option<&mut Vec<TimelinePoint>>,
    now_us: f64,
) -> Result<(), ScenarioError> {
    let stats = s.stats()?;
    if let Some(metrics) = metrics {
        let text = kvtier::metrics::prometheus_text(&stats);
        if let Ok(mut shared) = metrics.text.lock() {
            *shared = text;
        }
        for observer in &metrics.observers {
            observer(now_us / 1e6, &stats);
        }
    }
    if let Some(timeline) = timeline {
        timeline.push(TimelinePoint::of(now_us / 1e6, &stats));
    }
    Ok(())
}
