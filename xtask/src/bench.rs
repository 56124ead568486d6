//! `cargo xtask bench`: the kvtier CLI bench workloads, criterion, and callgrind counts.
//!
//! Each `kvtier bench <w> .. --json` run prints one flat JSON object as the last line of
//! its stdout; `serde_json` reads it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::{capture_stdout, cargo, display_command, run_command};

const USAGE: &str = "usage: cargo xtask bench [--quick] [--no-criterion]\n       \
                     cargo xtask bench --callgrind <workload> [args..]\n       \
                     cargo xtask bench --runtimes [--rounds N]";

/// Workloads compared across runtimes: arguments and the JSON field compared.
const RUNTIME_CASES: &[(&str, &[&str], &str)] = &[
    (
        "w1 P=64 per request",
        &["w1", "--page-size", "64"],
        "ns_per_request",
    ),
    (
        "w2 N=256 steady step p50",
        &["w2", "--requests", "256"],
        "steady_p50_ns",
    ),
];

/// Workloads and their arguments for the full run.
const FULL: &[&[&str]] = &[
    &["w1", "--page-size", "64"],
    &["w1", "--page-size", "16"],
    &["w1", "--page-size", "64", "--l2"],
    &["w2", "--requests", "256"],
    &["w2", "--requests", "1024"],
    &["w3"],
    &["w1", "--page-size", "64", "--runtime", "actors"],
    &["w2", "--requests", "256", "--runtime", "actors"],
    &["w3", "--runtime", "actors"],
    &["h1"],
    &["h1", "--policy", "reference"],
    &["h1", "--runtime", "actors"],
    &["h2"],
    &["h2", "--runtime", "actors"],
    &["h3"],
    &["copy"],
    &["l3"],
];

/// Workloads for `--quick`.
const QUICK: &[&[&str]] = &[
    &["w1", "--page-size", "64"],
    &["w2", "--requests", "256"],
    &["w3"],
];

/// JSON fields shown in the table, in order.
const COLUMNS: &[&str] = &[
    "workload",
    "page_size",
    "steps",
    "hit_tokens",
    "writeback_ops",
    "loadback_ops",
    "retractions",
    "measured_ns",
];

pub fn run(root: &Path, args: &[String]) -> Result<()> {
    let mut quick = false;
    let mut criterion = true;
    let mut runtimes = false;
    let mut rounds = 7;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--no-criterion" => criterion = false,
            "--runtimes" => runtimes = true,
            "--rounds" => {
                rounds = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|&n: &usize| n > 0)
                    .with_context(|| format!("--rounds needs a positive count\n{USAGE}"))?;
            }
            "--callgrind" => {
                let rest: Vec<String> = args.cloned().collect();
                return callgrind(root, &rest);
            }
            other => bail!("unknown bench option `{other}`\n{USAGE}"),
        }
    }

    if runtimes {
        return compare_runtimes(root, rounds);
    }
    let workloads = if quick { QUICK } else { FULL };
    let bench_dir = root.join(target_dir()).join("bench");
    fs::create_dir_all(&bench_dir).with_context(|| format!("creating {}", bench_dir.display()))?;
    let jsonl_path = bench_dir.join("bench.jsonl");

    let mut jsonl = String::new();
    let mut rows = Vec::new();
    for workload in workloads {
        let mut command = cargo(root);
        command.args(["run", "--release", "-p", "kvtier-cli", "--", "bench"]);
        command.args(*workload).arg("--json");
        println!("==> bench: {}", display_command(&command));
        let stdout = capture_stdout(&mut command)?;
        let line = last_line(&stdout)
            .with_context(|| format!("`{}` printed nothing", display_command(&command)))?;
        let fields: Fields = parse_line(line, &display_command(&command))?;
        jsonl.push_str(line);
        jsonl.push('\n');
        // Rewritten after every run so that finished results survive a later failure.
        fs::write(&jsonl_path, &jsonl)
            .with_context(|| format!("writing {}", jsonl_path.display()))?;
        rows.push((workload.join(" "), fields));
    }

    println!();
    print!("{}", render_table(&rows));
    println!("\nwrote {}", jsonl_path.display());

    if criterion {
        let mut command = cargo(root);
        command.args(["bench", "--workspace"]);
        println!("\n==> bench: {}", display_command(&command));
        run_command(&mut command)?;
    }
    Ok(())
}

/// `cargo xtask bench --runtimes`: the core path and the actor system (actix, on the
/// calling thread), run alternately `rounds` times; medians and their ratio.
fn compare_runtimes(root: &Path, rounds: usize) -> Result<()> {
    let mut build = cargo(root);
    build.args(["build", "--release", "-p", "kvtier-cli"]);
    println!("==> bench: {}", display_command(&build));
    run_command(&mut build)?;
    let binary = root.join(target_dir()).join("release").join("kvtier");
    let runtimes = ["core", "actors"];
    println!(
        "\n{:<28} {:>12} {:>12} {:>7}",
        "workload", "core", "actors", "ratio"
    );
    for (name, args, field) in RUNTIME_CASES {
        let mut samples: [Vec<f64>; 2] = Default::default();
        for _ in 0..rounds {
            for (i, runtime) in runtimes.iter().enumerate() {
                let mut command = Command::new(&binary);
                command
                    .arg("bench")
                    .args(*args)
                    .args(["--runtime", runtime, "--json"]);
                let stdout = capture_stdout(&mut command)?;
                let line = last_line(&stdout).context("the benchmark printed nothing")?;
                let fields: Fields = parse_line(line, &display_command(&command))?;
                let value = fields
                    .get(*field)
                    .and_then(Value::as_f64)
                    .with_context(|| format!("no `{field}` in {line}"))?;
                samples[i].push(value);
            }
        }
        let [core, actors] = samples.map(median);
        println!(
            "{name:<28} {:>10.2}µs {:>10.2}µs {:>6.2}x",
            core / 1e3,
            actors / 1e3,
            actors / core
        );
    }
    println!("(medians of {rounds} interleaved runs each)");
    Ok(())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// `cargo xtask bench --callgrind <w> [args..]`.
fn callgrind(root: &Path, args: &[String]) -> Result<()> {
    let Some((workload, extra)) = args.split_first() else {
        bail!("--callgrind needs a workload\n{USAGE}");
    };
    if workload.starts_with('-') || workload.contains('/') {
        bail!("--callgrind needs a workload name first, got `{workload}`\n{USAGE}");
    }

    let mut build = cargo(root);
    build.args(["build", "--release", "-p", "kvtier-cli"]);
    println!("==> bench: {}", display_command(&build));
    run_command(&mut build)?;

    let target = target_dir();
    let bench_dir = target.join("bench");
    fs::create_dir_all(root.join(&bench_dir))
        .with_context(|| format!("creating {}", bench_dir.display()))?;
    let tag: String = args
        .iter()
        .map(|a| a.trim_start_matches('-'))
        .collect::<Vec<_>>()
        .join("-");
    let out_file = bench_dir.join(format!("callgrind.{tag}.out"));
    let mut valgrind = Command::new("valgrind");
    valgrind
        .current_dir(root)
        .args([
            "--tool=callgrind",
            "--collect-atstart=no",
            "--toggle-collect=*measured_*",
        ])
        .arg(format!("--callgrind-out-file={}", out_file.display()))
        .arg(target.join("release").join("kvtier"))
        .arg("bench")
        .arg(workload)
        .args(extra)
        .arg("--json");
    println!("==> bench: {}", display_command(&valgrind));
    let stdout = capture_stdout(&mut valgrind)?;
    let line = last_line(&stdout).context("the benchmark printed nothing on stdout")?;
    let counts: CallgrindCounts = parse_line(line, &display_command(&valgrind))?;
    println!("json: {line}");

    let out_path = root.join(&out_file);
    let profile =
        fs::read_to_string(&out_path).with_context(|| format!("reading {}", out_path.display()))?;
    let total = callgrind_total_ir(&profile).with_context(|| {
        format!(
            "no `summary:` or `totals:` line with an Ir count in {}",
            out_path.display()
        )
    })?;
    println!(
        "callgrind {}: total Ir {}",
        args.join(" "),
        group_thousands(total)
    );
    match counts.divisor() {
        Some((key, count)) => println!(
            "callgrind {}: Ir / {key} = {} / {count} = {:.1}",
            args.join(" "),
            group_thousands(total),
            total as f64 / count
        ),
        None => println!(
            "callgrind {}: no positive `callgrind_divisor` or `finished` in the JSON; no per-unit count",
            args.join(" ")
        ),
    }
    println!(
        "profile: {} (inspect with callgrind_annotate)",
        out_file.display()
    );
    Ok(())
}

/// The cargo target directory, relative to the repository root unless `CARGO_TARGET_DIR`
/// says otherwise.
pub(crate) fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from)
}

fn last_line(stdout: &str) -> Option<&str> {
    stdout.lines().map(str::trim).rfind(|line| !line.is_empty())
}

/// A bench line as the table reads it: any fields (each workload has its own).
type Fields = Map<String, Value>;

/// `line`, the last stdout line of `command`, read as `T`: the error names both.
fn parse_line<T: serde::de::DeserializeOwned>(line: &str, command: &str) -> Result<T> {
    serde_json::from_str(line).with_context(|| {
        format!("last stdout line of `{command}` is not the bench's JSON object: {line}")
    })
}

/// The fields of a bench line that a callgrind count is divided by.
#[derive(Debug, Deserialize)]
struct CallgrindCounts {
    callgrind_divisor: Option<f64>,
    finished: Option<f64>,
}

impl CallgrindCounts {
    /// What the total Ir is divided by: `callgrind_divisor` if positive, else `finished`.
    fn divisor(&self) -> Option<(&'static str, f64)> {
        [
            ("callgrind_divisor", self.callgrind_divisor),
            ("finished", self.finished),
        ]
        .into_iter()
        .find_map(|(key, value)| value.filter(|&v| v > 0.0).map(|v| (key, v)))
    }
}

// ---------------------------------------------------------------------------------------
// Table
// ---------------------------------------------------------------------------------------

/// A cell: integers as written, fractions to one decimal place.
fn render(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => format!("{f:.1}"),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// A fixed-width table: the run's arguments, [`COLUMNS`], and ns per request or step.
fn render_table(rows: &[(String, Fields)]) -> String {
    let mut header: Vec<String> = vec!["run".to_string()];
    header.extend(COLUMNS.iter().map(|c| (*c).to_string()));
    header.push("ns/unit".to_string());

    let mut cells: Vec<Vec<String>> = vec![header];
    for (run, fields) in rows {
        let mut row = vec![run.clone()];
        for column in COLUMNS {
            row.push(fields.get(*column).map_or_else(|| "-".to_string(), render));
        }
        let per_unit = [("ns_per_request", "req"), ("ns_per_step", "step")]
            .into_iter()
            .find_map(|(key, unit)| Some(format!("{}/{unit}", render(fields.get(key)?))));
        row.push(per_unit.unwrap_or_else(|| "-".to_string()));
        cells.push(row);
    }

    let columns = cells[0].len();
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            cells
                .iter()
                .map(|row| row[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in &cells {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (cell, &width))| {
                // Text columns left-aligned, numbers right-aligned.
                if i <= 1 {
                    format!("{cell:<width$}")
                } else {
                    format!("{cell:>width$}")
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn group_thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

// ---------------------------------------------------------------------------------------
// Callgrind output
// ---------------------------------------------------------------------------------------

/// Total Ir from a callgrind output file: the `summary:` line, else the last `totals:`
/// line, at the position of `Ir` in the `events:` line (first if not listed).
fn callgrind_total_ir(contents: &str) -> Option<u64> {
    let mut events_index = 0;
    let mut summary = None;
    let mut totals = None;
    for line in contents.lines() {
        if let Some(events) = line.strip_prefix("events:") {
            events_index = events
                .split_whitespace()
                .position(|e| e == "Ir")
                .unwrap_or(0);
        } else if let Some(rest) = line.strip_prefix("summary:") {
            summary = Some(rest);
        } else if let Some(rest) = line.strip_prefix("totals:") {
            totals = Some(rest);
        }
    }
    summary
        .or(totals)?
        .split_whitespace()
        .nth(events_index)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::json;

    fn fields(value: Value) -> Fields {
        match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    #[test]
    fn reads_a_bench_line() {
        let line = r#"{"workload":"w1","page_size":64,"l2":true,"ns_per_step":12.5e0,"rows":[1,{"b":"]"}]}"#;
        let fields: Fields = parse_line(line, "kvtier bench w1 --json").expect("parses");
        assert_eq!(fields.get("workload"), Some(&json!("w1")));
        assert_eq!(fields.get("page_size").and_then(Value::as_u64), Some(64));
        assert_eq!(
            fields.get("ns_per_step").and_then(Value::as_f64),
            Some(12.5)
        );
        assert_eq!(fields.get("rows"), Some(&json!([1, {"b": "]"}])));
    }

    #[test]
    fn a_bad_line_is_refused_naming_the_command_and_the_line() {
        for bad in [
            "",
            "[1]",
            "{\"a\":1",
            "{\"a\":1} x",
            "{a:1}",
            "Compiling kvtier",
        ] {
            let err = parse_line::<Fields>(bad, "kvtier bench w9 --json")
                .expect_err(bad)
                .to_string();
            assert!(err.contains("`kvtier bench w9 --json`"), "{err}");
            assert!(err.ends_with(&format!(": {bad}")), "{err}");
        }
        // A known field of the wrong type is an error, not a silent miss.
        assert!(parse_line::<CallgrindCounts>(r#"{"finished":"ten"}"#, "x").is_err());
    }

    #[test]
    fn cells_keep_integers_and_round_fractions() {
        assert_eq!(render(&json!(64)), "64");
        assert_eq!(render(&json!(-3)), "-3");
        assert_eq!(render(&json!(812.345)), "812.3");
        assert_eq!(render(&json!(45.0)), "45.0");
        assert_eq!(render(&json!("w1")), "w1");
        assert_eq!(render(&json!(null)), "null");
        assert_eq!(render(&json!({"d": 2})), r#"{"d":2}"#);
    }

    #[test]
    fn reads_callgrind_totals() {
        let header = "# callgrind format\nversion: 1\ncmd: kvtier bench w1\nevents: Ir\n";
        assert_eq!(
            callgrind_total_ir(&format!(
                "{header}summary: 123456\nfn=(1) f\n5 7\ntotals: 123456\n"
            )),
            Some(123_456)
        );
        assert_eq!(
            callgrind_total_ir(&format!("{header}fn=(1) f\n5 7\ntotals: 99\n")),
            Some(99)
        );
        assert_eq!(
            callgrind_total_ir("events: Dr Ir\nsummary: 5 42\n"),
            Some(42)
        );
        assert_eq!(callgrind_total_ir(header), None);
    }

    #[test]
    fn divisor_prefers_callgrind_divisor() {
        let counts = |line: &str| -> CallgrindCounts { parse_line(line, "x").expect("parses") };
        let both = counts(r#"{"finished":10,"callgrind_divisor":4,"workload":"w1"}"#);
        assert_eq!(both.divisor(), Some(("callgrind_divisor", 4.0)));
        let finished = counts(r#"{"finished":10}"#);
        assert_eq!(finished.divisor(), Some(("finished", 10.0)));
        let zero = counts(r#"{"callgrind_divisor":0,"finished":0}"#);
        assert_eq!(zero.divisor(), None);
        assert_eq!(counts("{}").divisor(), None);
    }

    #[test]
    fn table_shows_selected_fields() {
        let rows = vec![
            (
                "w1 --page-size 64".to_string(),
                fields(json!({
                    "workload": "w1",
                    "page_size": 64,
                    "ns_per_request": 812.345,
                    "ignored": 1,
                })),
            ),
            (
                "w3".to_string(),
                fields(json!({"steps": 1000, "ns_per_step": 45})),
            ),
        ];
        let table = render_table(&rows);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("run"));
        assert!(lines[0].contains("measured_ns") && lines[0].ends_with("ns/unit"));
        assert!(lines[1].starts_with("w1 --page-size 64  w1"));
        assert!(lines[1].ends_with("812.3/req"));
        assert!(lines[2].contains("1000") && lines[2].ends_with("45/step"));
        assert!(!table.contains("ignored"));
    }

    #[test]
    fn last_nonempty_line() {
        assert_eq!(last_line("noise\n{\"a\":1}\n\n"), Some("{\"a\":1}"));
        assert_eq!(last_line("\n \n"), None);
    }

    #[test]
    fn thousands() {
        assert_eq!(group_thousands(0), "0");
        assert_eq!(group_thousands(999), "999");
        assert_eq!(group_thousands(1000), "1,000");
        assert_eq!(group_thousands(1_234_567), "1,234,567");
    }
}
