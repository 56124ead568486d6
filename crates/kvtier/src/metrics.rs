//! The system's counters, gauges and histograms ([`series`]), as Prometheus text
//! (exposition format 0.0.4, [`prometheus_text`]) for a small `/metrics` endpoint
//! ([`MetricsServer`]), and as OpenTelemetry metrics (`crate::telemetry`).
//!
//! Where a dashboard already keys on a name, the series carries TokenSpeed's
//! (`tokenspeed:` mirrors vLLM's `vllm:`); every other series is `kvtier_…` with
//! underscores and bounded labels only (`tier`, `op`, `state`, and a model's own
//! paged-cache group ids). Prometheus reserves colons for recording rules, so
//! `promtool`'s lint flags the compatible names: that is by design, and the only thing
//! it flags.

use std::fmt::Write;
use std::io::{Read, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use kvtier_types::Histogram;

use crate::SystemStats;

/// What a series measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Durations in seconds, in [`kvtier_types::DURATION_BOUNDS`]' buckets.
    Histogram,
}

/// One sample's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    /// A counter's or gauge's.
    Int(u64),
    /// A histogram's.
    Histogram(Histogram),
}

/// One labelled sample of a series.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// Label names and values (bounded sets).
    pub labels: Vec<(&'static str, String)>,
    /// Its value.
    pub value: Value,
}

/// One metric family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Series {
    /// Its Prometheus name.
    pub name: &'static str,
    /// Its OpenTelemetry name where it differs from the one [`Series::otel_name`]
    /// derives (the GenAI conventions' names for the latency histograms).
    pub otel: Option<&'static str>,
    /// What it measures.
    pub kind: Kind,
    /// One line of help.
    pub help: &'static str,
    /// Its samples.
    pub samples: Vec<Sample>,
}

impl Series {
    fn new(name: &'static str, kind: Kind, help: &'static str) -> Self {
        Self {
            name,
            otel: None,
            kind,
            help,
            samples: Vec::new(),
        }
    }

    fn int(mut self, labels: &[(&'static str, &str)], value: u64) -> Self {
        self.samples.push(Sample {
            labels: labels.iter().map(|&(k, v)| (k, v.to_owned())).collect(),
            value: Value::Int(value),
        });
        self
    }

    fn histogram(mut self, labels: &[(&'static str, &str)], value: Histogram) -> Self {
        self.samples.push(Sample {
            labels: labels.iter().map(|&(k, v)| (k, v.to_owned())).collect(),
            value: Value::Histogram(value),
        });
        self
    }

    fn otel(mut self, name: &'static str) -> Self {
        self.otel = Some(name);
        self
    }

    /// Its OpenTelemetry instrument name: the override, else the Prometheus name with
    /// the colon as a dot and without a counter's `_total` (which exporters add back).
    pub fn otel_name(&self) -> String {
        if let Some(name) = self.otel {
            return name.to_owned();
        }
        let name = self.name.replace(':', ".");
        match (self.kind, name.strip_suffix("_total")) {
            (Kind::Counter, Some(base)) => base.to_owned(),
            _ => name,
        }
    }
}

/// Every series of `stats`.
pub fn series(stats: &SystemStats) -> Vec<Series> {
    use Kind::{Counter, Gauge};
    let s = &stats.scheduler;
    let mut out = Vec::new();
    let tiers = |name, kind, help, [d, h]: [u64; 2]| {
        Series::new(name, kind, help)
            .int(&[("tier", "device")], d)
            .int(&[("tier", "host")], h)
    };

    // TokenSpeed's names (dashboards key on them).
    out.push(
        Series::new(
            "tokenspeed:num_requests_running",
            Gauge,
            "Requests in prefill or decoding.",
        )
        .int(&[], (s.prefilling + s.decoding) as u64),
    );
    out.push(
        Series::new(
            "tokenspeed:num_requests_waiting",
            Gauge,
            "Requests waiting: queued, looking up in L3, or retracted.",
        )
        .int(&[], (s.waiting + s.looking_up + s.retracted) as u64),
    );
    out.push(
        Series::new(
            "tokenspeed:num_preemptions_total",
            Counter,
            "Requests retracted to make room.",
        )
        .int(&[], s.retractions),
    );
    // The prefix cache as a queries/hits counter pair (never a ratio gauge).
    out.push(
        Series::new(
            "tokenspeed:prefix_cache_queries_total",
            Counter,
            "Prompt tokens of admitted requests, each at its first chunk.",
        )
        .int(&[], s.prompt_query_tokens),
    );
    out.push(
        Series::new(
            "tokenspeed:prefix_cache_hits_total",
            Counter,
            "Of those, tokens reused from the cache (any tier).",
        )
        .int(&[], s.hit_tokens),
    );
    out.push(
        Series::new(
            "tokenspeed:time_to_first_token_seconds",
            Kind::Histogram,
            "Submit to the first generated token's arrival at the scheduler (wall clock).",
        )
        .otel("gen_ai.server.time_to_first_token")
        .histogram(&[], *s.time_to_first_token),
    );
    out.push(
        Series::new(
            "tokenspeed:inter_token_latency_seconds",
            Kind::Histogram,
            "Per finished request: first token to finish over the tokens after the first.",
        )
        .otel("gen_ai.server.time_per_output_token")
        .histogram(&[], *s.time_per_output_token),
    );
    out.push(
        Series::new(
            "tokenspeed:request_queue_time_seconds",
            Kind::Histogram,
            "Submit to first chunk (wall clock).",
        )
        .histogram(&[], *s.queue_time),
    );

    // kvtier's own.
    out.push(tiers(
        "kvtier_cached_pages",
        Gauge,
        "Pages held by the prefix cache, per tier.",
        [s.cached_device_pages, s.cached_host_pages],
    ));
    out.push(tiers(
        "kvtier_free_pages",
        Gauge,
        "Free pages of each tier's pool.",
        [
            u64::from(s.available_device_pages),
            u64::from(s.available_host_pages),
        ],
    ));
    out.push(tiers(
        "kvtier_evicted_pages_total",
        Counter,
        "Pages the prefix cache evicted to make room, per tier.",
        [s.evicted_device_pages, s.evicted_host_pages],
    ));
    // Queried and hit tokens per tier, as counter pairs: each tier is asked for what
    // the tiers above it did not have (device: the whole prompt; host: what the device
    // missed; L3: what the host missed too); its hits are the tokens it supplied (host:
    // loaded back; L3: of those, the request's own prefetch brought).
    let l3_hits = s.hit_tokens_l3;
    let host_hits = s.hit_tokens_host.saturating_sub(l3_hits);
    let device_hits = s.hit_tokens.saturating_sub(s.hit_tokens_host);
    let host_queried = s.prompt_query_tokens.saturating_sub(device_hits);
    let l3_queried = host_queried.saturating_sub(host_hits);
    out.push(
        Series::new(
            "kvtier_prefix_queried_tokens_total",
            Counter,
            "Prompt tokens each tier was asked for at first chunks (those the tiers above it missed).",
        )
        .int(&[("tier", "device")], s.prompt_query_tokens)
        .int(&[("tier", "host")], host_queried)
        .int(&[("tier", "l3")], l3_queried),
    );
    out.push(
        Series::new(
            "kvtier_prefix_hit_tokens_total",
            Counter,
            "Prompt tokens reused at first chunks, by the tier they came from.",
        )
        .int(&[("tier", "device")], device_hits)
        .int(&[("tier", "host")], host_hits)
        .int(&[("tier", "l3")], l3_hits),
    );
    let mut lost = Series::new(
        "kvtier_lost_hit_tokens_total",
        Counter,
        "Prompt tokens computed again although cached once, by why (with track_lost_hits).",
    );
    for (reason, tokens) in kvtier_fsm::LOST_HIT_REASONS.iter().zip(s.lost_hit_tokens) {
        lost = lost.int(&[("reason", reason)], tokens);
    }
    out.push(lost);
    out.push(
        Series::new(
            "kvtier_step_duration_seconds",
            Kind::Histogram,
            "Wall-clock duration of each scheduling step.",
        )
        .histogram(&[], *s.step_duration),
    );
    for (name, help, value) in [
        ("kvtier_plans_total", "Execution plans built.", s.plans),
        (
            "kvtier_recomputes_total",
            "Requests queued again to compute their history.",
            s.recomputes,
        ),
        (
            "kvtier_scheduler_aborts_total",
            "Requests the scheduler gave up on.",
            s.scheduler_aborts,
        ),
        (
            "kvtier_failed_write_backs_total",
            "Write-backs acknowledged as failed.",
            s.failed_write_backs,
        ),
        (
            "kvtier_failed_load_backs_total",
            "Load-backs reported failed.",
            s.failed_load_backs,
        ),
        (
            "kvtier_lost_lookups_total",
            "L3 lookups that never answered (their requests went on without L3 hits).",
            s.lost_lookups,
        ),
    ] {
        out.push(Series::new(name, Counter, help).int(&[], value));
    }
    // Hybrid models: the families' pools.
    if let Some(states) = &s.states {
        out.push(
            Series::new(
                "kvtier_state_slots",
                Gauge,
                "Recurrent-state slots per tier: free, and holding a cached state.",
            )
            .int(
                &[("tier", "device"), ("state", "free")],
                u64::from(states.free_device_slots),
            )
            .int(
                &[("tier", "device"), ("state", "cached")],
                u64::from(states.device_states),
            )
            .int(
                &[("tier", "host"), ("state", "free")],
                u64::from(states.free_host_slots),
            )
            .int(
                &[("tier", "host"), ("state", "cached")],
                u64::from(states.host_states),
            ),
        );
    }
    if let Some(groups) = &s.groups {
        let mut pages = Series::new(
            "kvtier_group_pages",
            Gauge,
            "Pages of each paged-cache group's pool: its size and its free pages.",
        );
        for g in &groups.groups {
            pages = pages
                .int(
                    &[("group", &g.id), ("state", "total")],
                    u64::from(g.total_pages),
                )
                .int(
                    &[("group", &g.id), ("state", "free")],
                    u64::from(g.free_pages),
                );
        }
        out.push(pages);
    }
    if let Some(device) = &stats.device {
        out.push(
            Series::new(
                "kvtier_copy_bytes_total",
                Counter,
                "Bytes the device's write-backs and load-backs moved.",
            )
            .int(&[], device.moved_bytes),
        );
    }
    if let Some(l3) = &stats.l3 {
        for (name, help, value) in [
            (
                "kvtier_l3_lookups_total",
                "Prompts looked up in L3.",
                l3.lookups,
            ),
            (
                "kvtier_l3_lookup_hit_pages_total",
                "Pages L3 lookups found.",
                l3.lookup_hit_pages,
            ),
            (
                "kvtier_l3_prefetched_bytes_total",
                "Bytes prefetched from L3 whole and verified.",
                l3.prefetched_bytes,
            ),
            (
                "kvtier_l3_backed_up_bytes_total",
                "Bytes backed up to L3.",
                l3.backed_up_bytes,
            ),
            (
                "kvtier_l3_failed_prefetches_total",
                "L3 prefetches that failed outright.",
                l3.failed_prefetches,
            ),
            (
                "kvtier_l3_failed_backups_total",
                "L3 backups with a page not stored.",
                l3.failed_backups,
            ),
        ] {
            out.push(Series::new(name, Counter, help).int(&[], value));
        }
        let [nothing, below, no_room, no_slot] = s.prefetch_skipped;
        out.push(
            Series::new(
                "kvtier_l3_prefetch_skipped_total",
                Counter,
                "First chunks admitted without an L3 prefetch although their lookup found pages, by why.",
            )
            .int(&[("reason", "nothing_missing")], nothing)
            .int(&[("reason", "below_threshold")], below)
            .int(&[("reason", "no_host_room")], no_room)
            .int(&[("reason", "no_state_slot")], no_slot),
        );
        out.push(
            Series::new(
                "kvtier_l3_op_duration_seconds",
                Kind::Histogram,
                "Wall-clock duration of the L3 actor's messages: a lookup, a plan's transfers.",
            )
            .histogram(&[("op", "lookup")], *l3.lookup_duration)
            .histogram(&[("op", "transfer")], *l3.transfer_duration),
        );
    }
    out
}

/// `stats` as Prometheus text.
pub fn prometheus_text(stats: &SystemStats) -> String {
    let mut out = String::new();
    for series in series(stats) {
        let kind = match series.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let name = series.name;
        let _ = writeln!(out, "# HELP {name} {}", series.help);
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for sample in &series.samples {
            let labels: Vec<String> = sample
                .labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
                .collect();
            match sample.value {
                Value::Int(v) => {
                    let _ = writeln!(out, "{name}{} {v}", braces(&labels));
                }
                Value::Histogram(h) => {
                    let le = |bound: String| {
                        let mut all = labels.clone();
                        all.push(format!("le=\"{bound}\""));
                        braces(&all)
                    };
                    for (bound, count) in h.cumulative() {
                        let _ = writeln!(out, "{name}_bucket{} {count}", le(bound.to_string()));
                    }
                    let _ = writeln!(out, "{name}_bucket{} {}", le("+Inf".into()), h.count());
                    let _ = writeln!(out, "{name}_sum{} {}", braces(&labels), h.sum_seconds());
                    let _ = writeln!(out, "{name}_count{} {}", braces(&labels), h.count());
                }
            }
        }
    }
    out
}

fn braces(labels: &[String]) -> String {
    if labels.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", labels.join(","))
    }
}

/// A label value as the exposition format quotes it.
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The latest metrics text, shared between whoever updates it and a [`MetricsServer`].
pub type MetricsText = Arc<Mutex<String>>;

/// A `/metrics` endpoint: answers `GET /metrics` with the latest text of a
/// [`MetricsText`] (Prometheus exposition 0.0.4), anything else with 404. Plain HTTP/1.1
/// on one thread, one connection at a time: a scraper's load. Stops when dropped.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `addr` (port 0 picks a free one) and serves `text` from a thread.
    pub fn serve(addr: SocketAddr, text: MetricsText) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("kvtier-metrics".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if stopping.load(Ordering::Acquire) {
                        break;
                    }
                    // A client that goes away mid-answer only loses its answer.
                    if let Ok(stream) = stream {
                        let _ = answer(stream, &text);
                    }
                }
            })?;
        Ok(Self {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept; the thread sees the flag and ends.
        drop(TcpStream::connect(self.addr));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Answers one request.
fn answer(mut stream: TcpStream, text: &MetricsText) -> std::io::Result<()> {
    stream.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16 * 1024 {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&buf[..n]);
    }
    let line = request.split(|&b| b == b'\r').next().unwrap_or_default();
    let (status, body) = if line.starts_with(b"GET /metrics ") {
        let body = text.lock().map(|t| t.clone()).unwrap_or_default();
        ("200 OK", body)
    } else {
        ("404 Not Found", "not found\n".to_string())
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_has_help_and_type_and_bounded_labels() {
        let mut stats = SystemStats::default();
        stats.scheduler.decoding = 3;
        stats.scheduler.waiting = 2;
        stats.scheduler.evicted_host_pages = 7;
        (stats.scheduler.hit_tokens, stats.scheduler.hit_tokens_host) = (100, 40);
        stats.scheduler.hit_tokens_l3 = 16;
        let text = prometheus_text(&stats);
        assert!(
            text.contains("tokenspeed:num_requests_running 3\n"),
            "{text}"
        );
        assert!(text.contains("tokenspeed:num_requests_waiting 2\n"));
        assert!(text.contains("kvtier_evicted_pages_total{tier=\"host\"} 7\n"));
        assert!(text.contains("kvtier_prefix_hit_tokens_total{tier=\"device\"} 60\n"));
        assert!(text.contains("kvtier_prefix_hit_tokens_total{tier=\"host\"} 24\n"));
        assert!(text.contains("kvtier_prefix_hit_tokens_total{tier=\"l3\"} 16\n"));
        assert!(text.contains("tokenspeed:time_to_first_token_seconds_bucket{le=\"+Inf\"} 0\n"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let sample = line.split(['{', ' ']).next().unwrap_or_default();
            // A histogram's samples are its name with _bucket, _sum or _count.
            let name = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    let base = sample.strip_suffix(suffix)?;
                    text.contains(&format!("# TYPE {base} histogram"))
                        .then_some(base)
                })
                .unwrap_or(sample);
            assert!(
                text.contains(&format!("# TYPE {name} ")),
                "{name} has a type"
            );
            assert!(text.contains(&format!("# HELP {name} ")), "{name} has help");
        }
        assert!(
            !text.contains("kvtier_l3_"),
            "no L3 series without an L3 actor"
        );
    }

    fn get(addr: SocketAddr, path: &str) -> String {
        let mut stream = TcpStream::connect(addr).expect("connect");
        write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").expect("request");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("response");
        response
    }

    /// The endpoint answers the latest text on loopback, 404 elsewhere, and stops when
    /// dropped (its port then refuses connections).
    #[test]
    fn the_endpoint_serves_the_latest_text() {
        let text = MetricsText::default();
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let server = MetricsServer::serve(loopback, Arc::clone(&text)).expect("serve");
        let addr = server.addr();
        *text.lock().expect("lock") = "kvtier_plans_total 3\n".into();
        let response = get(addr, "/metrics");
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(response.contains("version=0.0.4"));
        assert!(
            response.ends_with("\r\n\r\nkvtier_plans_total 3\n"),
            "{response}"
        );
        *text.lock().expect("lock") = "kvtier_plans_total 4\n".into();
        assert!(get(addr, "/metrics").ends_with("kvtier_plans_total 4\n"));
        assert!(get(addr, "/").starts_with("HTTP/1.1 404"));
        drop(server);
        assert!(TcpStream::connect(addr).is_err(), "stopped");
    }
}
