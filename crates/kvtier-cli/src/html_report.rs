//! `kvtier replay --report FILE.html`: one self-contained HTML page (inline SVG, no
//! scripts, nothing fetched) with the run's summary and four plots over the virtual
//! clock: hit ratio per tier, pool usage, the TTFT distribution and L3 traffic.

use std::fmt::Write;

use kvtier_sim::scenario::{ScenarioReport, TimelinePoint};

/// Plot area, in SVG units.
const WIDTH: f64 = 500.0;
const HEIGHT: f64 = 240.0;
/// Margins around it: left (tick labels), right, top (title), bottom (axis label).
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 28.0;
const BOTTOM: f64 = 40.0;

/// Series colours: device, host, L3, then others (colour-blind safe).
const COLOURS: [&str; 5] = ["#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9"];

/// One line of a chart.
struct Line<'a> {
    name: &'a str,
    points: Vec<(f64, f64)>,
}

/// The whole page.
pub fn render(report: &ScenarioReport) -> String {
    let t = &report.timeline;
    let mut page = String::new();
    let _ = write!(
        page,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>kvtier replay: {name}</title><style>{STYLE}</style></head><body>\
         <h1>kvtier replay: {name}</h1>",
        name = escape(&report.workload)
    );
    page.push_str(&summary(report));
    page.push_str("<div class=\"plots\">");
    page.push_str(&chart(
        "Prefix hit ratio by tier (cumulative)",
        "virtual time (s)",
        "share of queried prompt tokens",
        &hit_ratio_lines(t),
        None,
        percent,
    ));
    page.push_str(&chart(
        "Pool usage",
        "virtual time (s)",
        "pages cached",
        &[
            line("device", t, |p| p.cached_pages[0] as f64),
            line("host", t, |p| p.cached_pages[1] as f64),
        ],
        None,
        count,
    ));
    page.push_str(&ttft_histogram(&report.ttft_ms));
    page.push_str(&chart(
        "L3 traffic (cumulative)",
        "virtual time (s)",
        "MiB",
        &[
            line("prefetched", t, |p| mib(p.l3_prefetched_bytes)),
            line("backed up", t, |p| mib(p.l3_backed_up_bytes)),
        ],
        None,
        count,
    ));
    page.push_str(
        "</div><p class=\"note\">Made by <code>kvtier replay --report</code>; \
                   times are the replay's virtual clock (docs/data-plane.md's cost model).\
                   </p></body></html>\n",
    );
    page
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:24px;color:#222;background:#fff}\
h1{font-size:22px}table{border-collapse:collapse;margin-bottom:16px}\
td{padding:3px 12px;border-bottom:1px solid #eee}td:first-child{color:#555}\
.plots{display:flex;flex-wrap:wrap;gap:16px}svg{border:1px solid #ddd;background:#fcfcfc}\
.note{color:#666;font-size:13px}";

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn line<'a>(name: &'a str, t: &[TimelinePoint], y: impl Fn(&TimelinePoint) -> f64) -> Line<'a> {
    Line {
        name,
        points: t.iter().map(|p| (p.virtual_s, y(p))).collect(),
    }
}

/// Each tier's share of the prompt tokens queried so far, and all tiers together.
fn hit_ratio_lines(t: &[TimelinePoint]) -> [Line<'static>; 4] {
    let ratio = |hits: fn(&TimelinePoint) -> u64| {
        move |p: &TimelinePoint| {
            if p.queried_tokens == 0 {
                0.0
            } else {
                hits(p) as f64 / p.queried_tokens as f64
            }
        }
    };
    [
        line("device", t, ratio(|p| p.hit_tokens[0])),
        line("host", t, ratio(|p| p.hit_tokens[1])),
        line("L3", t, ratio(|p| p.hit_tokens[2])),
        line("all tiers", t, ratio(|p| p.hit_tokens.iter().sum())),
    ]
}

fn summary(r: &ScenarioReport) -> String {
    let hit = |tokens: u64| crate::report::pct(tokens, r.prompt_tokens);
    let rows = [
        (
            "requests",
            format!(
                "{} ({} finished, {} aborted)",
                r.requests, r.finished, r.aborted
            ),
        ),
        ("prompt tokens", r.prompt_tokens.to_string()),
        ("generated tokens", r.generated_tokens.to_string()),
        (
            "prefix hits",
            format!(
                "{:.1} % (device {:.1} %, host {:.1} %, L3 {:.1} %)",
                hit(r.hit_tokens),
                hit(r.hit_tokens.saturating_sub(r.hit_tokens_host)),
                hit(r.hit_tokens_host.saturating_sub(r.hit_tokens_l3)),
                hit(r.hit_tokens_l3)
            ),
        ),
        (
            "TTFT",
            format!(
                "{:.1} ms mean; {:.1} / {:.1} / {:.1} ms p50 / p90 / p99",
                r.ttft_mean_ms, r.ttft_p50_ms, r.ttft_p90_ms, r.ttft_p99_ms
            ),
        ),
        ("time per token", format!("{:.1} ms mean", r.tpot_mean_ms)),
        ("steps", r.steps.to_string()),
        ("virtual time", format!("{:.2} s", r.virtual_s)),
        ("integrity errors", r.integrity_errors.to_string()),
        ("output digest", r.output_digest.clone()),
    ];
    let mut out = String::from("<table>");
    for (name, value) in rows {
        let _ = write!(out, "<tr><td>{name}</td><td>{}</td></tr>", escape(&value));
    }
    out.push_str("</table>");
    out
}

fn percent(v: f64) -> String {
    format!("{:.0} %", v * 100.0)
}

fn count(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 100.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// A line chart of `lines` (x from 0, y from 0 to `y_max` or the largest value).
fn chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    lines: &[Line<'_>],
    y_max: Option<f64>,
    y_tick: fn(f64) -> String,
) -> String {
    let all = lines.iter().flat_map(|l| &l.points);
    let x_max = all.clone().map(|p| p.0).fold(0.0, f64::max).max(1e-9);
    // Room above the highest line, so that its level reads off the axis.
    let y_max = y_max
        .unwrap_or_else(|| all.map(|p| p.1).fold(0.0, f64::max) * 1.25)
        .max(1e-9);
    let mut svg = frame(title, x_label, y_label);
    axes(&mut svg, x_max, y_max, count, y_tick);
    for (i, l) in lines.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let points: Vec<String> = l
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x, x_max), sy(y, y_max)))
            .collect();
        let _ = write!(
            svg,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>",
            points.join(" ")
        );
        legend(&mut svg, i, l.name, colour);
    }
    svg.push_str("</svg>");
    svg
}

/// The distribution of TTFTs as bars over 20 equal bins up to the largest.
fn ttft_histogram(ttft_ms: &[f64]) -> String {
    const BINS: usize = 20;
    let x_max = ttft_ms.iter().copied().fold(0.0, f64::max).max(1e-9);
    let mut counts = [0u64; BINS];
    for &v in ttft_ms {
        let bin = ((v / x_max) * BINS as f64) as usize;
        counts[bin.min(BINS - 1)] += 1;
    }
    let y_max = counts.iter().copied().max().unwrap_or(0).max(1) as f64;
    let mut svg = frame("TTFT distribution", "time to first token (ms)", "requests");
    axes(&mut svg, x_max, y_max, count, count);
    let width = WIDTH / BINS as f64;
    for (i, &c) in counts.iter().enumerate() {
        let y = sy(c as f64, y_max);
        let _ = write!(
            svg,
            "<rect x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"/>",
            LEFT + i as f64 * width + 1.0,
            width - 2.0,
            TOP + HEIGHT - y,
            COLOURS[0]
        );
    }
    svg.push_str("</svg>");
    svg
}

fn sx(x: f64, x_max: f64) -> f64 {
    LEFT + x / x_max * WIDTH
}

fn sy(y: f64, y_max: f64) -> f64 {
    TOP + HEIGHT - y / y_max * HEIGHT
}

fn frame(title: &str, x_label: &str, y_label: &str) -> String {
    let (w, h) = (LEFT + WIDTH + RIGHT, TOP + HEIGHT + BOTTOM);
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         font-size=\"11\" role=\"img\" aria-label=\"{title}\">\
         <text x=\"{LEFT}\" y=\"18\" font-size=\"14\" font-weight=\"bold\">{title}</text>\
         <text x=\"{:.0}\" y=\"{:.0}\" text-anchor=\"middle\">{x_label}</text>\
         <text x=\"12\" y=\"{:.0}\" transform=\"rotate(-90 12 {:.0})\" \
         text-anchor=\"middle\">{y_label}</text>",
        LEFT + WIDTH / 2.0,
        h - 6.0,
        TOP + HEIGHT / 2.0,
        TOP + HEIGHT / 2.0,
    )
}

fn axes(
    svg: &mut String,
    x_max: f64,
    y_max: f64,
    x_tick: fn(f64) -> String,
    y_tick: fn(f64) -> String,
) {
    let _ = write!(
        svg,
        "<line x1=\"{LEFT}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#888\"/>\
         <line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{b}\" stroke=\"#888\"/>",
        b = TOP + HEIGHT,
        r = LEFT + WIDTH
    );
    for i in 0..=4 {
        let f = f64::from(i) / 4.0;
        let (x, y) = (LEFT + f * WIDTH, TOP + HEIGHT - f * HEIGHT);
        let _ = write!(
            svg,
            "<text x=\"{x:.0}\" y=\"{:.0}\" text-anchor=\"middle\">{}</text>\
             <text x=\"{:.0}\" y=\"{:.0}\" text-anchor=\"end\">{}</text>\
             <line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{:.0}\" y2=\"{y:.1}\" stroke=\"#eee\"/>",
            TOP + HEIGHT + 14.0,
            x_tick(f * x_max),
            LEFT - 6.0,
            y + 4.0,
            y_tick(f * y_max),
            LEFT + WIDTH,
        );
    }
}

fn legend(svg: &mut String, i: usize, name: &str, colour: &str) {
    let (x, y) = (LEFT + WIDTH - 110.0, TOP + 12.0 + 16.0 * i as f64);
    let _ = write!(
        svg,
        "<rect x=\"{x}\" y=\"{:.0}\" width=\"10\" height=\"10\" fill=\"{colour}\"/>\
         <text x=\"{:.0}\" y=\"{y:.0}\">{}</text>",
        y - 9.0,
        x + 14.0,
        escape(name)
    );
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(s: f64, queried: u64, hits: [u64; 3]) -> TimelinePoint {
        TimelinePoint {
            virtual_s: s,
            queried_tokens: queried,
            hit_tokens: hits,
            ..TimelinePoint::default()
        }
    }

    #[test]
    fn the_page_is_self_contained_with_its_four_plots() {
        let report = ScenarioReport {
            workload: "a <test>".into(),
            timeline: vec![point(0.0, 0, [0; 3]), point(1.0, 100, [10, 20, 5])],
            ttft_ms: vec![1.0, 2.0, 2.5, 40.0],
            ..ScenarioReport::default()
        };
        let page = render(&report);
        assert_eq!(page.matches("<svg").count(), 4);
        assert!(page.contains("a &lt;test&gt;"), "names are escaped");
        for fetch in ["<script", "src=", "href=", "url("] {
            assert!(!page.contains(fetch), "nothing is fetched or run: {fetch}");
        }
        // The cumulative all-tier ratio at 1 s is 35 %, the highest value: the axis goes
        // to 35 % * 1.25, so y = TOP + HEIGHT * (1 - 1 / 1.25).
        let y = TOP + HEIGHT * (1.0 - 1.0 / 1.25);
        assert!(
            page.contains(&format!("{:.1},{y:.1}", LEFT + WIDTH)),
            "{page}"
        );
    }
}
