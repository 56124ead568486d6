//! OpenTelemetry export: the actors' `tracing` spans and the system's metrics, over
//! OTLP/HTTP (protobuf) to a collector.
//!
//! [`init`] is the one call an embedder makes: it builds the exporters and installs a
//! global `tracing` subscriber that turns spans into OpenTelemetry spans. What it
//! exports:
//!
//! * each request's `request` span (from submit until the scheduler forgets it) with the
//!   `gen_ai.*` attributes peers use and `kvtier.*` ones, and one child span per phase of
//!   its life (`queued`, `looking_up`, `prefetching`, `prefilling`, `decoding`,
//!   `retracted`, `recomputing`, then `finished` or `aborted`);
//! * the calls of the embedding API and, under them, what the actors did for each;
//! * a `slow_step` span for every scheduling step slower than the scheduler's
//!   `slow_step_threshold`, backdated to the step's start (faster steps record nothing).
//!
//! Exporting never waits on the collector: spans queue in a bounded batch that a
//! background thread sends, and a full queue or a collector that is down loses spans,
//! never requests.

use std::time::{Duration, SystemTime};

use opentelemetry::KeyValue;
use opentelemetry::trace::{Span as _, Tracer as _, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use kvtier_types::DURATION_BOUNDS;

use crate::metrics::{Kind, Series, Value};
use crate::{SetupError, SystemStats};

/// The environment variable OpenTelemetry SDKs read the collector's base URL from.
pub const OTLP_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// Where and how to export.
#[derive(Debug, Clone)]
pub struct TelemetryConfig {
    /// The collector's base URL (`http://127.0.0.1:4318`): spans go to
    /// `{endpoint}/v1/traces`, metrics to `{endpoint}/v1/metrics`.
    pub endpoint: String,
    /// The resource's `service.name`.
    pub service_name: String,
    /// How often metrics are exported.
    pub metrics_interval: Duration,
    /// How long one export may take before it is given up (its data lost).
    pub export_timeout: Duration,
    /// Spans waiting for export at most; more are dropped.
    pub max_queued_spans: usize,
}

impl TelemetryConfig {
    /// Export to `endpoint` (a base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT` takes it).
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into().trim_end_matches('/').to_owned(),
            service_name: "kvtier".into(),
            metrics_interval: Duration::from_secs(5),
            export_timeout: Duration::from_secs(2),
            max_queued_spans: 65_536,
        }
    }

    /// The endpoint `OTEL_EXPORTER_OTLP_ENDPOINT` names, if it is set.
    pub fn from_env() -> Option<Self> {
        std::env::var(OTLP_ENDPOINT_ENV)
            .ok()
            .filter(|s| !s.trim().is_empty())
            .map(Self::new)
    }
}

/// The exporters. Dropping it flushes what is queued (each export bounded by
/// [`TelemetryConfig::export_timeout`]) and stops them.
#[derive(Debug)]
pub struct Telemetry {
    tracer_provider: SdkTracerProvider,
    meter_provider: SdkMeterProvider,
}

impl Telemetry {
    /// Builds the span and metric exporters for `config` (installs nothing).
    pub fn start(config: &TelemetryConfig) -> Result<Self, SetupError> {
        if !config.endpoint.starts_with("http://") {
            return Err(SetupError::OtlpEndpoint(config.endpoint.clone()));
        }
        let resource = Resource::builder()
            .with_service_name(config.service_name.clone())
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let spans = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(format!("{}/v1/traces", config.endpoint))
            .with_timeout(config.export_timeout)
            .build()
            .map_err(|e| SetupError::OtlpExporter(e.to_string()))?;
        let batch = BatchConfigBuilder::default()
            .with_max_queue_size(config.max_queued_spans)
            .with_max_export_batch_size(2048)
            .with_scheduled_delay(Duration::from_millis(500))
            .build();
        let tracer_provider = SdkTracerProvider::builder()
            .with_span_processor(
                BatchSpanProcessor::builder(spans)
                    .with_batch_config(batch)
                    .build(),
            )
            .with_resource(resource.clone())
            .build();
        let metrics = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_endpoint(format!("{}/v1/metrics", config.endpoint))
            .with_timeout(config.export_timeout)
            .build()
            .map_err(|e| SetupError::OtlpExporter(e.to_string()))?;
        let reader = opentelemetry_sdk::metrics::PeriodicReader::builder(metrics)
            .with_interval(config.metrics_interval)
            .build();
        let meter_provider = SdkMeterProvider::builder()
            .with_reader(reader)
            .with_resource(resource)
            .build();
        Ok(Self {
            tracer_provider,
            meter_provider,
        })
    }

    /// A subscriber that exports kvtier's spans (level `INFO` and above) through these
    /// exporters: for `tracing::subscriber::with_default`, or to install globally.
    pub fn subscriber(&self) -> impl Subscriber + Send + Sync + 'static {
        let tracer = self.tracer_provider.tracer("kvtier");
        tracing_subscriber::registry()
            .with(LevelFilter::INFO)
            .with(
                tracing_opentelemetry::layer()
                    .with_tracer(tracer.clone())
                    .with_location(false)
                    .with_threads(false)
                    .with_tracked_inactivity(false),
            )
            .with(SlowSteps { tracer })
    }

    /// The meter kvtier's OpenTelemetry metrics are made with.
    pub fn meter(&self) -> opentelemetry::metrics::Meter {
        use opentelemetry::metrics::MeterProvider as _;
        self.meter_provider.meter("kvtier")
    }

    /// Sends what is queued now (bounded by the export timeout); failures lose data.
    pub fn flush(&self) {
        let _ = self.tracer_provider.force_flush();
        let _ = self.meter_provider.force_flush();
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        let _ = self.tracer_provider.shutdown();
        let _ = self.meter_provider.shutdown();
    }
}

/// Starts the exporters for `config` and installs their subscriber as the process's
/// global one. Keep the returned [`Telemetry`] alive while exporting; drop it to flush.
pub fn init(config: &TelemetryConfig) -> Result<Telemetry, SetupError> {
    let telemetry = Telemetry::start(config)?;
    tracing::subscriber::set_global_default(telemetry.subscriber())
        .map_err(|_| SetupError::SubscriberInstalled)?;
    Ok(telemetry)
}

/// The system's metrics ([`crate::metrics::series`]) as OpenTelemetry instruments of
/// the [`Telemetry`]'s meter: hand it each new [`SystemStats`] snapshot with
/// [`Self::update`]; the periodic reader exports the latest.
///
/// Counters and gauges are observable instruments read from the last snapshot.
/// Histograms are OpenTelemetry histograms with the same bucket bounds: each update
/// records the observations added to each bucket since the last one at the bucket's
/// midpoint, so the exported bucket counts are exact and the sum is the midpoints'.
pub struct MetricsExport {
    meter: opentelemetry::metrics::Meter,
    latest: Arc<Mutex<Vec<Series>>>,
    /// Families with an instrument, by Prometheus name.
    registered: BTreeSet<&'static str>,
    /// Observable instruments, kept alive.
    observers: Vec<Box<dyn std::any::Any + Send + Sync>>,
    histograms: BTreeMap<&'static str, opentelemetry::metrics::Histogram<f64>>,
    /// Each histogram sample's last bucket counts, by name and labels.
    seen: BTreeMap<SampleKey, Vec<u64>>,
}

/// A sample of a family: its name and labels.
type SampleKey = (&'static str, Vec<(&'static str, String)>);

impl std::fmt::Debug for MetricsExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsExport")
            .field("registered", &self.registered)
            .finish_non_exhaustive()
    }
}

impl MetricsExport {
    /// Exports through `telemetry`'s meter.
    pub fn new(telemetry: &Telemetry) -> Self {
        Self {
            meter: telemetry.meter(),
            latest: Arc::default(),
            registered: BTreeSet::new(),
            observers: Vec::new(),
            histograms: BTreeMap::new(),
            seen: BTreeMap::new(),
        }
    }

    /// Takes a new snapshot of the system's stats.
    pub fn update(&mut self, stats: &SystemStats) {
        let series = crate::metrics::series(stats);
        for family in &series {
            if self.registered.insert(family.name) {
                self.register(family);
            }
            if family.kind == Kind::Histogram {
                self.record_histogram(family);
            }
        }
        if let Ok(mut latest) = self.latest.lock() {
            *latest = series;
        }
    }

    fn register(&mut self, family: &Series) {
        let name = family.name;
        let latest = Arc::clone(&self.latest);
        // Every sample of the family in the last snapshot, with its attributes.
        let samples = move || -> Vec<(u64, Vec<KeyValue>)> {
            let Ok(latest) = latest.lock() else {
                return Vec::new();
            };
            latest
                .iter()
                .filter(|f| f.name == name)
                .flat_map(|f| &f.samples)
                .filter_map(|sample| match sample.value {
                    Value::Int(v) => Some((v, attributes(&sample.labels))),
                    Value::Histogram(_) => None,
                })
                .collect()
        };
        let help = family.help;
        match family.kind {
            Kind::Counter => self.observers.push(Box::new(
                self.meter
                    .u64_observable_counter(family.otel_name())
                    .with_description(help)
                    .with_callback(move |observer| {
                        for (v, attrs) in samples() {
                            observer.observe(v, &attrs);
                        }
                    })
                    .build(),
            )),
            Kind::Gauge => self.observers.push(Box::new(
                self.meter
                    .u64_observable_gauge(family.otel_name())
                    .with_description(help)
                    .with_callback(move |observer| {
                        for (v, attrs) in samples() {
                            observer.observe(v, &attrs);
                        }
                    })
                    .build(),
            )),
            Kind::Histogram => {
                let histogram = self
                    .meter
                    .f64_histogram(family.otel_name())
                    .with_description(help)
                    .with_unit("s")
                    .with_boundaries(DURATION_BOUNDS.to_vec())
                    .build();
                self.histograms.insert(name, histogram);
            }
        }
    }

    fn record_histogram(&mut self, family: &Series) {
        let Some(instrument) = self.histograms.get(family.name) else {
            return;
        };
        for sample in &family.samples {
            let Value::Histogram(h) = sample.value else {
                continue;
            };
            let key = (family.name, sample.labels.clone());
            let before = self.seen.entry(key).or_default();
            before.resize(h.bucket_counts().len(), 0);
            let attrs = attributes(&sample.labels);
            for (i, (&now, was)) in h.bucket_counts().iter().zip(before.iter_mut()).enumerate() {
                let low = if i == 0 { 0.0 } else { DURATION_BOUNDS[i - 1] };
                let high = DURATION_BOUNDS.get(i).copied().unwrap_or(low * 2.0);
                for _ in *was..now {
                    instrument.record((low + high) / 2.0, &attrs);
                }
                *was = now;
            }
        }
    }
}

fn attributes(labels: &[(&'static str, String)]) -> Vec<KeyValue> {
    labels
        .iter()
        .map(|(k, v)| KeyValue::new(*k, v.clone()))
        .collect()
}

/// Turns the scheduler's `slow_step` events (target `kvtier::step`, which carry the
/// step's duration) into spans backdated to the step's start, under the span the step
/// ran in: a span for slow steps only, with no cost for the others.
struct SlowSteps {
    tracer: opentelemetry_sdk::trace::SdkTracer,
}

/// A slow step's fields, as OpenTelemetry attributes.
#[derive(Default)]
struct StepFields {
    elapsed_us: u64,
    attributes: Vec<KeyValue>,
}

impl Visit for StepFields {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "elapsed_us" {
            self.elapsed_us = value;
        }
        let key = format!("kvtier.step.{}", field.name());
        self.attributes
            .push(KeyValue::new(key, i64::try_from(value).unwrap_or(i64::MAX)));
    }

    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for SlowSteps {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != "kvtier::step" {
            return;
        }
        let mut fields = StepFields::default();
        event.record(&mut fields);
        let end = SystemTime::now();
        let start = end
            .checked_sub(Duration::from_micros(fields.elapsed_us))
            .unwrap_or(end);
        let parent = tracing::Span::current().context();
        let mut span = self
            .tracer
            .span_builder("slow_step")
            .with_start_time(start)
            .with_attributes(fields.attributes)
            .start_with_context(&self.tracer, &parent);
        span.end_with_timestamp(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_must_be_plain_http() {
        let err = Telemetry::start(&TelemetryConfig::new("https://127.0.0.1:4318"));
        assert!(matches!(err, Err(SetupError::OtlpEndpoint(_))));
        assert!(Telemetry::start(&TelemetryConfig::new("http://127.0.0.1:9/")).is_ok());
    }
}
