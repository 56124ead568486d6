//! `kvtier sweep --instances ...`: one trace over a grid of cluster sizes, routers and L3
//! arrangements, as a table and a plot (docs/cluster.md).

use kvtier_router::Policy;
use serde::Serialize;

use super::{ClusterOptions, ClusterReport, L3Scope, run_cluster};
use crate::scenario::{ScenarioError, ScenarioOptions};

/// The grid.
#[derive(Debug, Clone)]
pub struct ClusterSweepOptions {
    /// Each instance's run (a trace replay; its capacities are each instance's).
    pub base: ScenarioOptions,
    pub instances: Vec<usize>,
    pub policies: Vec<Policy>,
    pub scopes: Vec<L3Scope>,
}

/// One point of the grid.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterPoint {
    pub instances: usize,
    pub policy: String,
    pub l3: L3Scope,
    pub report: ClusterReport,
}

/// The grid's results, in grid order (instances, then L3, then router).
#[derive(Debug, Clone, Serialize)]
pub struct ClusterSweep {
    pub trace: String,
    pub requests: u64,
    pub prompt_tokens: u64,
    pub unbounded_hit_tokens: u64,
    pub points: Vec<ClusterPoint>,
}

/// Runs every point, one after another (each already runs an actix system per
/// instance); `progress(done, total)` after each.
pub fn run_cluster_sweep(
    o: &ClusterSweepOptions,
    mut progress: impl FnMut(usize, usize),
) -> Result<ClusterSweep, ScenarioError> {
    let mut grid = Vec::new();
    for &n in &o.instances {
        for &scope in &o.scopes {
            for &policy in &o.policies {
                grid.push((n, scope, policy));
            }
        }
    }
    let mut points = Vec::with_capacity(grid.len());
    for (i, &(n, scope, policy)) in grid.iter().enumerate() {
        // A namespace per point: a long-lived Mooncake master keeps earlier points'
        // objects.
        let base = ScenarioOptions {
            l3_model: format!(
                "{}-{n}x-{}-{}",
                o.base.l3_model,
                policy.name(),
                scope.name()
            ),
            ..o.base.clone()
        };
        let report = run_cluster(&ClusterOptions::new(base, n, policy, scope))?;
        points.push(ClusterPoint {
            instances: n,
            policy: policy.name().into(),
            l3: scope,
            report,
        });
        progress(i + 1, grid.len());
    }
    let first = points.first().map(|p| &p.report);
    Ok(ClusterSweep {
        trace: o
            .base
            .trace
            .as_ref()
            .map_or_else(String::new, |t| t.name.clone()),
        requests: first.map_or(0, |r| r.requests),
        prompt_tokens: first.map_or(0, |r| r.prompt_tokens),
        unbounded_hit_tokens: first.map_or(0, |r| r.unbounded_hit_tokens),
        points,
    })
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

impl ClusterSweep {
    /// The plot: one bar per point, the share of the ideal bound its instances reused,
    /// coloured by L3 arrangement, with the TTFT p50 beside it.
    pub fn svg(&self) -> String {
        const W: f64 = 760.0;
        const LEFT: f64 = 230.0;
        const TOP: f64 = 56.0;
        const BAR: f64 = 22.0;
        const GAP: f64 = 8.0;
        let plot_w = W - LEFT - 150.0;
        let h = TOP + (BAR + GAP) * self.points.len() as f64 + 50.0;
        let color = |scope: L3Scope| match scope {
            L3Scope::Off => "#9e9e9e",
            L3Scope::Private => "#1f77b4",
            L3Scope::Shared => "#2ca02c",
        };
        let mut svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{h}\" \
             font-family=\"sans-serif\" font-size=\"12\">\n\
             <rect width=\"{W}\" height=\"{h}\" fill=\"white\"/>\n\
             <text x=\"20\" y=\"24\" font-size=\"15\">Prompt tokens reused, share of the ideal bound: \
             {} ({} requests)</text>\n",
            escape(&self.trace),
            self.requests
        );
        for k in 0..=4 {
            let x = LEFT + plot_w * f64::from(k) / 4.0;
            svg.push_str(&format!(
                "<line x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/>\n\
                 <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{} %</text>\n",
                TOP - 6.0,
                h - 40.0,
                h - 24.0,
                25 * k
            ));
        }
        for (i, p) in self.points.iter().enumerate() {
            let y = TOP + (BAR + GAP) * i as f64;
            let share = p.report.hit_ratio_of_ideal.clamp(0.0, 1.0);
            svg.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{} × {}, L3 {}</text>\n\
                 <rect x=\"{LEFT}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{BAR}\" fill=\"{}\"/>\n\
                 <text x=\"{:.1}\" y=\"{:.1}\">{:.1} %  (TTFT p50 {:.0} ms)</text>\n",
                LEFT - 8.0,
                y + BAR * 0.7,
                p.instances,
                p.policy,
                p.l3.name(),
                plot_w * share,
                color(p.l3),
                LEFT + plot_w * share + 6.0,
                y + BAR * 0.7,
                100.0 * share,
                p.report.ttft_p50_ms
            ));
        }
        svg.push_str("</svg>\n");
        svg
    }
}
