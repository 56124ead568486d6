//! The system's counters and gauges as Prometheus text (exposition format 0.0.4), and
//! a small `/metrics` endpoint that serves it ([`MetricsServer`]).
//!
//! Where a dashboard already keys on a name, the series carries TokenSpeed's
//! (`tokenspeed:` mirrors vLLM's `vllm:`); every other series is `kvtier_…` with
//! underscores and bounded labels only (`tier`: `device`, `host`). Prometheus reserves
//! colons for recording rules, so `promtool`'s lint flags the compatible names: that is
//! by design, and the only thing it flags.

use std::fmt::Write;
use std::io::{Read, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::SystemStats;

/// One series family being written.
struct Family<'a> {
    out: &'a mut String,
}

impl Family<'_> {
    fn header(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
        self
    }

    fn sample(&mut self, name: &str, labels: &str, value: u64) -> &mut Self {
        let _ = if labels.is_empty() {
            writeln!(self.out, "{name} {value}")
        } else {
            writeln!(self.out, "{name}{{{labels}}} {value}")
        };
        self
    }
}

/// `stats` as Prometheus text.
pub fn prometheus_text(stats: &SystemStats) -> String {
    let mut out = String::new();
    let s = &stats.scheduler;
    let mut f = Family { out: &mut out };
    let gauge = |f: &mut Family<'_>, name: &str, help: &str, value: u64| {
        f.header(name, "gauge", help).sample(name, "", value);
    };
    let counter = |f: &mut Family<'_>, name: &str, help: &str, value: u64| {
        f.header(name, "counter", help).sample(name, "", value);
    };
    let per_tier = |f: &mut Family<'_>, name: &str, kind: &str, help: &str, [d, h]: [u64; 2]| {
        f.header(name, kind, help)
            .sample(name, "tier=\"device\"", d)
            .sample(name, "tier=\"host\"", h);
    };

    // TokenSpeed's names (dashboards key on them).
    gauge(
        &mut f,
        "tokenspeed:num_requests_running",
        "Requests in prefill or decoding.",
        (s.prefilling + s.decoding) as u64,
    );
    gauge(
        &mut f,
        "tokenspeed:num_requests_waiting",
        "Requests waiting: queued, looking up in L3, or retracted.",
        (s.waiting + s.looking_up + s.retracted) as u64,
    );
    counter(
        &mut f,
        "tokenspeed:num_preemptions_total",
        "Requests retracted to make room.",
        s.retractions,
    );
    // The prefix cache as a queries/hits counter pair (never a ratio gauge).
    counter(
        &mut f,
        "tokenspeed:prefix_cache_queries_total",
        "Prompt tokens of admitted requests, each at its first chunk.",
        s.prompt_query_tokens,
    );
    counter(
        &mut f,
        "tokenspeed:prefix_cache_hits_total",
        "Of those, tokens reused from the cache (any tier).",
        s.hit_tokens,
    );

    // kvtier's own.
    per_tier(
        &mut f,
        "kvtier_cached_pages",
        "gauge",
        "Pages held by the prefix cache, per tier.",
        [s.cached_device_pages, s.cached_host_pages],
    );
    per_tier(
        &mut f,
        "kvtier_free_pages",
        "gauge",
        "Free pages of each tier's pool.",
        [
            u64::from(s.available_device_pages),
            u64::from(s.available_host_pages),
        ],
    );
    per_tier(
        &mut f,
        "kvtier_evicted_pages_total",
        "counter",
        "Pages the prefix cache evicted to make room, per tier.",
        [s.evicted_device_pages, s.evicted_host_pages],
    );
    // The hits by the tier they came from: device only, loaded back from host, and
    // of those the ones the request's own prefetch brought from L3.
    let host_only = s.hit_tokens_host.saturating_sub(s.hit_tokens_l3);
    let device_only = s.hit_tokens.saturating_sub(s.hit_tokens_host);
    let hits = "kvtier_prefix_hit_tokens_total";
    f.header(
        hits,
        "counter",
        "Prompt tokens reused at first chunks, by the tier they came from.",
    )
    .sample(hits, "tier=\"device\"", device_only)
    .sample(hits, "tier=\"host\"", host_only)
    .sample(hits, "tier=\"l3\"", s.hit_tokens_l3);
    counter(
        &mut f,
        "kvtier_plans_total",
        "Execution plans built.",
        s.plans,
    );
    counter(
        &mut f,
        "kvtier_recomputes_total",
        "Requests queued again to compute their history.",
        s.recomputes,
    );
    counter(
        &mut f,
        "kvtier_scheduler_aborts_total",
        "Requests the scheduler gave up on.",
        s.scheduler_aborts,
    );
    counter(
        &mut f,
        "kvtier_failed_write_backs_total",
        "Write-backs acknowledged as failed.",
        s.failed_write_backs,
    );
    counter(
        &mut f,
        "kvtier_failed_load_backs_total",
        "Load-backs reported failed.",
        s.failed_load_backs,
    );
    counter(
        &mut f,
        "kvtier_lost_lookups_total",
        "L3 lookups that never answered (their requests went on without L3 hits).",
        s.lost_lookups,
    );
    if let Some(device) = &stats.device {
        counter(
            &mut f,
            "kvtier_copy_bytes_total",
            "Bytes the device's write-backs and load-backs moved.",
            device.moved_bytes,
        );
    }
    if let Some(l3) = &stats.l3 {
        counter(
            &mut f,
            "kvtier_l3_lookups_total",
            "Prompts looked up in L3.",
            l3.lookups,
        );
        counter(
            &mut f,
            "kvtier_l3_lookup_hit_pages_total",
            "Pages L3 lookups found.",
            l3.lookup_hit_pages,
        );
        counter(
            &mut f,
            "kvtier_l3_prefetched_bytes_total",
            "Bytes prefetched from L3 whole and verified.",
            l3.prefetched_bytes,
        );
        counter(
            &mut f,
            "kvtier_l3_backed_up_bytes_total",
            "Bytes backed up to L3.",
            l3.backed_up_bytes,
        );
        counter(
            &mut f,
            "kvtier_l3_failed_prefetches_total",
            "L3 prefetches that failed outright.",
            l3.failed_prefetches,
        );
        counter(
            &mut f,
            "kvtier_l3_failed_backups_total",
            "L3 backups with a page not stored.",
            l3.failed_backups,
        );
    }
    out
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
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
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
