//! An engine loop embedding kvtier with its observability on.
//!
//! * spans and metrics over OTLP/HTTP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set
//!   (`kvtier::telemetry::init`; a request's trace holds its phases);
//! * the Prometheus text at `http://127.0.0.1:PORT/metrics` (`MetricsServer`);
//! * the KV events of every tier on vLLM's wire (`KvEventPublisher`, ZeroMQ PUB on
//!   loopback), for a KV-aware router.
//!
//! The engine is the examples' made-up one (`kvtier_examples::run_plan`).
//!
//! Run it with `cargo run -p kvtier-examples --example observed_engine`; with a collector
//! at hand, `OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 cargo run …`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvtier::kv_publisher::KvEventPublisher;
use kvtier::metrics::{MetricsServer, prometheus_text};
use kvtier::telemetry::{MetricsExport, TelemetryConfig};
use kvtier::vllm_events::WireEvent;
use kvtier::{BlockingHandle, System};
use kvtier_types::{EngineEvent, SchedulerConfig};

/// What one run showed.
#[derive(Debug)]
pub struct Observed {
    /// Requests that finished.
    pub finished: usize,
    /// What `GET /metrics` answered at the end.
    pub metrics: String,
    /// KV events published (every tier's), and the endpoint they went to.
    pub kv_events: usize,
    /// The KV event endpoint.
    pub kv_endpoint: String,
    /// Whether spans and metrics went to an OTLP collector.
    pub exported: bool,
}

/// Runs the loop with everything on; `telemetry` asks for the OTLP export (read from
/// `OTEL_EXPORTER_OTLP_ENDPOINT`; it installs the global tracing subscriber).
pub fn run(telemetry: bool) -> Result<Observed, Box<dyn std::error::Error>> {
    let config = telemetry.then(TelemetryConfig::from_env).flatten();
    let telemetry = config.map(|c| kvtier::telemetry::init(&c)).transpose()?;
    let mut export = telemetry.as_ref().map(MetricsExport::new);
    let text = Arc::new(Mutex::new(String::new()));
    let server = MetricsServer::serve("127.0.0.1:0".parse()?, Arc::clone(&text))?;
    let publisher = KvEventPublisher::bind("tcp://127.0.0.1:0", "kv-events", Some(0))?;

    let handle = BlockingHandle::new(
        System::builder(SchedulerConfig {
            page_size: 16,
            device_pages: 64,
            host_pages: 128,
            enable_kv_cache_events: true,
            slow_step_threshold: Some(Duration::from_millis(1)),
            ..SchedulerConfig::default()
        })
        .start()?,
    );
    let requests = kvtier_examples::users_sharing_a_system_prompt();
    let total = requests.len();
    // The first user alone; the others a step later reuse the system prompt.
    let mut arrivals = requests.into_iter();
    handle.submit(arrivals.next().into_iter().collect())?;
    let (mut produced, mut finished, mut kv_events) = (Default::default(), 0, 0);
    let mut step = 0u32;
    loop {
        if step == 1 {
            handle.submit(arrivals.by_ref().collect())?;
        }
        let plan = handle.next_plan()?;
        let events = kvtier_examples::run_plan(&plan, &mut produced);
        finished += events
            .iter()
            .filter(|e| matches!(e, EngineEvent::Finish { .. }))
            .count();
        handle.advance(events)?;
        step += 1;
        // After each step: the cache's events to routers, the counters to scrapers.
        let batch = handle.take_kv_events()?;
        kv_events += batch.len();
        let wired: Vec<WireEvent<'_>> = batch.iter().map(WireEvent::Cache).collect();
        publisher.publish(f64::from(step), &wired);
        let stats = handle.stats()?;
        *text.lock().map_err(|_| "metrics lock")? = prometheus_text(&stats);
        if let Some(export) = export.as_mut() {
            export.update(&stats);
        }
        if finished == total && stats.scheduler.idle {
            break;
        }
    }
    let metrics = scrape(&server)?;
    handle.shutdown()?;
    Ok(Observed {
        finished,
        metrics,
        kv_events,
        kv_endpoint: publisher.endpoint().to_owned(),
        exported: telemetry.is_some(),
    })
}

/// What a scraper gets: `GET /metrics`.
fn scrape(server: &MetricsServer) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(server.addr())?;
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: kvtier\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer
        .split_once("\r\n\r\n")
        .map_or(answer.clone(), |(_, body)| body.to_owned()))
}

#[allow(
    dead_code,
    reason = "the test includes this file and calls run() instead"
)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let observed = run(true)?;
    println!("{} requests finished", observed.finished);
    println!(
        "{} KV events published on {}",
        observed.kv_events, observed.kv_endpoint
    );
    for line in observed
        .metrics
        .lines()
        .filter(|l| l.starts_with("tokenspeed:prefix"))
    {
        println!("{line}");
    }
    if observed.exported {
        println!("spans and metrics exported over OTLP");
    } else {
        println!("(set OTEL_EXPORTER_OTLP_ENDPOINT to export spans and metrics over OTLP)");
    }
    Ok(())
}
