//! The system's counters and gauges as Prometheus text (exposition format 0.0.4), for
//! an embedder's `/metrics` endpoint.
//!
//! Where a dashboard already keys on a name, the series carries TokenSpeed's
//! (`tokenspeed:` mirrors vLLM's `vllm:`); every other series is `kvtier_…` with
//! underscores and bounded labels only (`tier`: `device`, `host`). Prometheus reserves
//! colons for recording rules, so `promtool`'s lint flags the compatible names: that is
//! by design, and the only thing it flags.

use std::fmt::Write;

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
}
