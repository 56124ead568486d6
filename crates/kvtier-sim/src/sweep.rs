//! `kvtier sweep`: one trace replayed over a grid of capacities, the hit ratio of each
//! point, and a picture of it.
//!
//! Every point is a whole replay ([`crate::scenario::run_scenario`]) on its own system,
//! so points run in parallel, one per worker thread, and each is deterministic on its
//! own: the table is the same whatever the number of workers. The plot
//! ([`SweepReport::svg`]) draws hit ratio against device capacity, one line per host
//! capacity and L3 setting, and the unbounded cache's ratio as the ceiling.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Serialize;

use crate::Path;
use crate::scenario::{L3Store, ScenarioError, ScenarioOptions, TraceWorkload, run_scenario};

/// Tokens per page in trace replays.
const PAGE_TOKENS: u64 = 16;

/// What a sweep runs.
#[derive(Debug, Clone)]
pub struct SweepOptions {
    /// The trace, already sliced.
    pub trace: Arc<TraceWorkload>,
    /// Device capacities, in tokens.
    pub device_tokens: Vec<u64>,
    /// Host capacities, in tokens.
    pub host_tokens: Vec<u64>,
    /// L3 settings (`Off` and `Local`; `Mooncake` needs a cluster).
    pub l3: Vec<L3Store>,
    /// Worker threads (at least 1).
    pub jobs: usize,
}

/// One point of the grid.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SweepPoint {
    /// Device capacity, tokens.
    pub device_tokens: u64,
    /// Host capacity, tokens.
    pub host_tokens: u64,
    /// `off`, `local` or `mooncake`.
    pub l3: String,
    /// Prompt tokens in all.
    pub prompt_tokens: u64,
    /// Hit tokens (every tier).
    pub hit_tokens: u64,
    /// Of which loaded back from host.
    pub hit_tokens_host: u64,
    /// Of which prefetched from L3 (part of the host hits).
    pub hit_tokens_l3: u64,
    /// Requests the scheduler gave up on or refused (a prompt larger than the device).
    pub aborted: u64,
    /// Mean time to first token, ms of virtual time.
    pub ttft_mean_ms: f64,
}

impl SweepPoint {
    /// Hit tokens per prompt token.
    pub fn hit_ratio(&self) -> f64 {
        ratio(self.hit_tokens, self.prompt_tokens)
    }
}

fn ratio(n: u64, d: u64) -> f64 {
    if d == 0 { 0.0 } else { n as f64 / d as f64 }
}

/// The sweep's points, in grid order (L3, host, device).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SweepReport {
    /// The trace's name.
    pub trace: String,
    /// Requests replayed.
    pub requests: usize,
    /// The unbounded cache's hit tokens, and the prompt tokens (the ceiling of every
    /// point).
    pub unbounded_hit_tokens: u64,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// The points.
    pub points: Vec<SweepPoint>,
}

/// Runs every point of the grid, `jobs` at a time. The first failing point's error is
/// returned.
pub fn run_sweep(
    options: &SweepOptions,
    progress: impl Fn(usize, usize) + Sync,
) -> Result<SweepReport, ScenarioError> {
    let mut grid = Vec::new();
    for &l3 in &options.l3 {
        for &host in &options.host_tokens {
            for &device in &options.device_tokens {
                grid.push((device, host, l3));
            }
        }
    }
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<Result<SweepPoint, ScenarioError>>>> =
        grid.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..options.jobs.clamp(1, grid.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&(device, host, l3)) = grid.get(i) else {
                        break;
                    };
                    let point = run_point(&options.trace, device, host, l3);
                    if let Ok(mut slot) = results[i].lock() {
                        *slot = Some(point);
                    }
                    progress(done.fetch_add(1, Ordering::Relaxed) + 1, grid.len());
                }
            });
        }
    });
    let mut points = Vec::with_capacity(grid.len());
    for slot in results {
        let point = slot
            .into_inner()
            .ok()
            .flatten()
            .ok_or(ScenarioError::Stalled(0))?;
        points.push(point?);
    }
    let prompt_tokens = options
        .trace
        .requests
        .iter()
        .map(|r| u64::from(r.input_length))
        .sum();
    Ok(SweepReport {
        trace: options.trace.name.clone(),
        requests: options.trace.requests.len(),
        unbounded_hit_tokens: crate::trace::unbounded_hit_tokens(
            &options.trace.requests,
            PAGE_TOKENS as u32,
        ),
        prompt_tokens,
        points,
    })
}

fn run_point(
    trace: &Arc<TraceWorkload>,
    device_tokens: u64,
    host_tokens: u64,
    l3: L3Store,
) -> Result<SweepPoint, ScenarioError> {
    let pages = |tokens: u64| (tokens.div_ceil(PAGE_TOKENS) + 1).min(u64::from(u32::MAX)) as u32;
    let options = ScenarioOptions {
        path: Path::Core,
        l3,
        device_pages: Some(pages(device_tokens)),
        host_pages: Some(pages(host_tokens)),
        ..ScenarioOptions::shared_trace(Arc::clone(trace))
    };
    let r = run_scenario(&options)?;
    Ok(SweepPoint {
        device_tokens,
        host_tokens,
        l3: l3.name().into(),
        prompt_tokens: r.prompt_tokens,
        hit_tokens: r.hit_tokens,
        hit_tokens_host: r.hit_tokens_host,
        hit_tokens_l3: r.hit_tokens_l3,
        aborted: r.aborted + r.refused,
        ttft_mean_ms: r.ttft_mean_ms,
    })
}

impl SweepReport {
    /// The plot: hit ratio (y, %) against device capacity (x, tokens, log scale), one
    /// line per host capacity and L3 setting, the unbounded cache as a dashed ceiling.
    pub fn svg(&self) -> String {
        const W: f64 = 760.0;
        const H: f64 = 440.0;
        const LEFT: f64 = 70.0;
        const RIGHT: f64 = 230.0;
        const TOP: f64 = 50.0;
        const BOTTOM: f64 = 60.0;
        const COLORS: [&str; 8] = [
            "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
        ];
        let xs: Vec<u64> = {
            let mut v: Vec<u64> = self.points.iter().map(|p| p.device_tokens).collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let (x_min, x_max) = (
            xs.first().copied().unwrap_or(1).max(1) as f64,
            xs.last().copied().unwrap_or(1).max(1) as f64,
        );
        let ceiling = 100.0 * ratio(self.unbounded_hit_tokens, self.prompt_tokens);
        let y_max = self
            .points
            .iter()
            .map(|p| 100.0 * p.hit_ratio())
            .fold(ceiling, f64::max)
            .max(1.0);
        let y_max = (y_max / 10.0).ceil() * 10.0;
        let plot_w = W - LEFT - RIGHT;
        let plot_h = H - TOP - BOTTOM;
        let x_of = |x: u64| {
            if x_max <= x_min {
                LEFT + plot_w / 2.0
            } else {
                LEFT + plot_w * ((x as f64).ln() - x_min.ln()) / (x_max.ln() - x_min.ln())
            }
        };
        let y_of = |pct: f64| TOP + plot_h * (1.0 - pct / y_max);
        let mut svg = String::new();
        let mut line = |s: String| {
            svg.push_str(&s);
            svg.push('\n');
        };
        line(format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" \
             font-family=\"sans-serif\" font-size=\"12\">"
        ));
        line(format!(
            "<rect width=\"{W}\" height=\"{H}\" fill=\"white\"/>"
        ));
        line(format!(
            "<text x=\"{LEFT}\" y=\"24\" font-size=\"15\">Prompt tokens served from cache: {} \
             ({} requests)</text>",
            escape(&self.trace),
            self.requests
        ));
        // Axes and grid.
        for k in 0..=5 {
            let pct = y_max * f64::from(k) / 5.0;
            let y = y_of(pct);
            line(format!(
                "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>",
                LEFT + plot_w
            ));
            line(format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{pct:.0} %</text>",
                LEFT - 8.0,
                y + 4.0
            ));
        }
        for &x in &xs {
            let px = x_of(x);
            line(format!(
                "<line x1=\"{px:.1}\" y1=\"{TOP}\" x2=\"{px:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/>",
                TOP + plot_h
            ));
            line(format!(
                "<text x=\"{px:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                TOP + plot_h + 18.0,
                tokens_label(x)
            ));
        }
        line(format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">device capacity (tokens of \
             KV, log scale)</text>",
            LEFT + plot_w / 2.0,
            H - 14.0
        ));
        line(format!(
            "<text transform=\"translate(18 {:.1}) rotate(-90)\" text-anchor=\"middle\">hit \
             ratio</text>",
            TOP + plot_h / 2.0
        ));
        line(format!(
            "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{plot_w}\" height=\"{plot_h}\" \
             fill=\"none\" stroke=\"#444\"/>"
        ));
        // The ceiling.
        let yc = y_of(ceiling);
        line(format!(
            "<line x1=\"{LEFT}\" y1=\"{yc:.1}\" x2=\"{:.1}\" y2=\"{yc:.1}\" stroke=\"#000\" \
             stroke-dasharray=\"6 4\"/>",
            LEFT + plot_w
        ));
        // One line per (L3, host) series, in grid order.
        let mut series: Vec<(String, u64)> = Vec::new();
        for p in &self.points {
            let key = (p.l3.clone(), p.host_tokens);
            if !series.contains(&key) {
                series.push(key);
            }
        }
        let legend_x = LEFT + plot_w + 16.0;
        for (i, (l3, host)) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let mut pts: Vec<&SweepPoint> = self
                .points
                .iter()
                .filter(|p| &p.l3 == l3 && p.host_tokens == *host)
                .collect();
            pts.sort_by_key(|p| p.device_tokens);
            let path: Vec<String> = pts
                .iter()
                .map(|p| {
                    format!(
                        "{:.1},{:.1}",
                        x_of(p.device_tokens),
                        y_of(100.0 * p.hit_ratio())
                    )
                })
                .collect();
            line(format!(
                "<polyline points=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"/>",
                path.join(" ")
            ));
            for p in &pts {
                line(format!(
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\"/>",
                    x_of(p.device_tokens),
                    y_of(100.0 * p.hit_ratio())
                ));
            }
            let ly = TOP + 10.0 + 20.0 * i as f64;
            line(format!(
                "<line x1=\"{legend_x:.1}\" y1=\"{ly:.1}\" x2=\"{:.1}\" y2=\"{ly:.1}\" \
                 stroke=\"{color}\" stroke-width=\"2\"/>",
                legend_x + 22.0
            ));
            let label = if l3 == "off" {
                format!("device + host {}", tokens_label(*host))
            } else {
                format!("device + host {} + L3 ({l3})", tokens_label(*host))
            };
            line(format!(
                "<text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                legend_x + 28.0,
                ly + 4.0,
                escape(&label)
            ));
        }
        let ly = TOP + 10.0 + 20.0 * series.len() as f64;
        line(format!(
            "<line x1=\"{legend_x:.1}\" y1=\"{ly:.1}\" x2=\"{:.1}\" y2=\"{ly:.1}\" \
             stroke=\"#000\" stroke-dasharray=\"6 4\"/>",
            legend_x + 22.0
        ));
        line(format!(
            "<text x=\"{:.1}\" y=\"{:.1}\">unbounded cache ({ceiling:.1} %)</text>",
            legend_x + 28.0,
            ly + 4.0
        ));
        line("</svg>".into());
        svg
    }
}

/// `262144` → `256k`, `1048576` → `1M`.
fn tokens_label(tokens: u64) -> String {
    if tokens >= 1 << 20 && tokens.is_multiple_of(1 << 20) {
        format!("{}M", tokens >> 20)
    } else if tokens >= 1 << 10 && tokens.is_multiple_of(1 << 10) {
        format!("{}k", tokens >> 10)
    } else {
        tokens.to_string()
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
