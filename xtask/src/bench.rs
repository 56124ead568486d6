//! `cargo xtask bench`: the kvtier CLI bench workloads, criterion, and callgrind counts.
//!
//! Each `kvtier bench <w> .. --json` run prints one flat JSON object as the last line of
//! its stdout; a small hand-written parser reads it (no serde in xtask).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

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
        let fields = parse_flat_json(line).with_context(|| {
            format!(
                "last stdout line of `{}` is not a flat JSON object: {line}",
                display_command(&command)
            )
        })?;
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
                let fields = parse_flat_json(line)
                    .with_context(|| format!("not a flat JSON object: {line}"))?;
                let value = get(&fields, field)
                    .and_then(JsonValue::as_f64)
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
    let fields = parse_flat_json(line)
        .with_context(|| format!("last stdout line is not a flat JSON object: {line}"))?;
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
    match divisor(&fields) {
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
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from)
}

fn last_line(stdout: &str) -> Option<&str> {
    stdout.lines().map(str::trim).rfind(|line| !line.is_empty())
}

/// What the total Ir is divided by: `callgrind_divisor` if present, else `finished`.
fn divisor(fields: &[(String, JsonValue)]) -> Option<(&'static str, f64)> {
    ["callgrind_divisor", "finished"]
        .into_iter()
        .find_map(|key| {
            let value = get(fields, key)?.as_f64()?;
            (value > 0.0).then_some((key, value))
        })
}

// ---------------------------------------------------------------------------------------
// Table
// ---------------------------------------------------------------------------------------

fn get<'a>(fields: &'a [(String, JsonValue)], key: &str) -> Option<&'a JsonValue> {
    fields.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

/// A fixed-width table: the run's arguments, [`COLUMNS`], and ns per request or step.
fn render_table(rows: &[(String, Vec<(String, JsonValue)>)]) -> String {
    let mut header: Vec<String> = vec!["run".to_string()];
    header.extend(COLUMNS.iter().map(|c| (*c).to_string()));
    header.push("ns/unit".to_string());

    let mut cells: Vec<Vec<String>> = vec![header];
    for (run, fields) in rows {
        let mut row = vec![run.clone()];
        for column in COLUMNS {
            row.push(get(fields, column).map_or_else(|| "-".to_string(), JsonValue::render));
        }
        let per_unit = [("ns_per_request", "req"), ("ns_per_step", "step")]
            .into_iter()
            .find_map(|(key, unit)| Some(format!("{}/{unit}", get(fields, key)?.render())));
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

// ---------------------------------------------------------------------------------------
// Minimal flat JSON object parser
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
pub enum JsonValue {
    Str(String),
    /// The number's text as written.
    Num(String),
    Bool(bool),
    Null,
    /// A nested object or array, kept as raw text.
    Nested(String),
}

impl JsonValue {
    fn as_f64(&self) -> Option<f64> {
        match self {
            JsonValue::Num(n) => n.parse().ok(),
            _ => None,
        }
    }

    /// For the table: integers as written, fractions to one decimal place.
    fn render(&self) -> String {
        match self {
            JsonValue::Str(s) => s.clone(),
            JsonValue::Num(n) if n.contains(['.', 'e', 'E']) => n
                .parse::<f64>()
                .map_or_else(|_| n.clone(), |f| format!("{f:.1}")),
            JsonValue::Num(n) | JsonValue::Nested(n) => n.clone(),
            JsonValue::Bool(b) => b.to_string(),
            JsonValue::Null => "null".to_string(),
        }
    }
}

/// Parses one JSON object whose values are strings, numbers, booleans or null (nested
/// objects and arrays are kept as raw text). Keys keep their order.
pub fn parse_flat_json(text: &str) -> Result<Vec<(String, JsonValue)>> {
    let mut p = Parser { s: text, pos: 0 };
    let mut fields = Vec::new();
    p.skip_ws();
    p.expect('{')?;
    p.skip_ws();
    if p.peek() == Some('}') {
        p.bump();
    } else {
        loop {
            p.skip_ws();
            let key = p.string()?;
            p.skip_ws();
            p.expect(':')?;
            p.skip_ws();
            let value = p.value()?;
            fields.push((key, value));
            p.skip_ws();
            match p.bump() {
                Some(',') => {}
                Some('}') => break,
                other => bail!("expected `,` or `}}` at byte {}, found {other:?}", p.pos),
            }
        }
    }
    p.skip_ws();
    if p.pos < p.s.len() {
        bail!("trailing characters after the object at byte {}", p.pos);
    }
    Ok(fields)
}

struct Parser<'a> {
    s: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.s[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.bump();
        }
    }

    fn expect(&mut self, want: char) -> Result<()> {
        match self.bump() {
            Some(c) if c == want => Ok(()),
            other => bail!("expected `{want}` at byte {}, found {other:?}", self.pos),
        }
    }

    fn literal(&mut self, word: &str) -> Result<()> {
        if self.s[self.pos..].starts_with(word) {
            self.pos += word.len();
            Ok(())
        } else {
            bail!("expected `{word}` at byte {}", self.pos)
        }
    }

    fn string(&mut self) -> Result<String> {
        self.expect('"')?;
        let mut out = String::new();
        loop {
            match self.bump() {
                None => bail!("unterminated string"),
                Some('"') => return Ok(out),
                Some('\\') => match self.bump() {
                    Some('"') => out.push('"'),
                    Some('\\') => out.push('\\'),
                    Some('/') => out.push('/'),
                    Some('b') => out.push('\u{8}'),
                    Some('f') => out.push('\u{c}'),
                    Some('n') => out.push('\n'),
                    Some('r') => out.push('\r'),
                    Some('t') => out.push('\t'),
                    Some('u') => {
                        let hex = self
                            .s
                            .get(self.pos..self.pos + 4)
                            .context("short \\u escape")?;
                        let code = u32::from_str_radix(hex, 16).context("bad \\u escape")?;
                        self.pos += 4;
                        out.push(char::from_u32(code).unwrap_or('\u{fffd}'));
                    }
                    other => bail!("bad escape {other:?} at byte {}", self.pos),
                },
                Some(c) => out.push(c),
            }
        }
    }

    fn value(&mut self) -> Result<JsonValue> {
        match self.peek() {
            Some('"') => Ok(JsonValue::Str(self.string()?)),
            Some('t') => self.literal("true").map(|()| JsonValue::Bool(true)),
            Some('f') => self.literal("false").map(|()| JsonValue::Bool(false)),
            Some('n') => self.literal("null").map(|()| JsonValue::Null),
            Some('-' | '0'..='9') => {
                let start = self.pos;
                while self
                    .peek()
                    .is_some_and(|c| c.is_ascii_digit() || "+-.eE".contains(c))
                {
                    self.bump();
                }
                let text = &self.s[start..self.pos];
                if text.parse::<f64>().is_err() {
                    bail!("bad number `{text}` at byte {start}");
                }
                Ok(JsonValue::Num(text.to_string()))
            }
            Some('{' | '[') => self.nested(),
            other => bail!("unexpected {other:?} at byte {}", self.pos),
        }
    }

    /// Skips a balanced object or array, returning its raw text.
    fn nested(&mut self) -> Result<JsonValue> {
        let start = self.pos;
        let mut depth = 0usize;
        loop {
            match self.peek() {
                None => bail!("unterminated object or array starting at byte {start}"),
                Some('"') => {
                    self.string()?;
                }
                Some(c) => {
                    self.bump();
                    match c {
                        '{' | '[' => depth += 1,
                        '}' | ']' => {
                            depth -= 1;
                            if depth == 0 {
                                return Ok(JsonValue::Nested(self.s[start..self.pos].to_string()));
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> JsonValue {
        JsonValue::Str(v.to_string())
    }

    fn n(v: &str) -> JsonValue {
        JsonValue::Num(v.to_string())
    }

    #[test]
    fn parses_flat_object() {
        let fields = parse_flat_json(
            r#" {"workload":"w1","page_size":64,"l2":true,"x":null,"ns_per_step":12.5e0,"neg":-3,"esc":"a\"b\\c\u0041"} "#,
        );
        let expected = vec![
            ("workload".to_string(), s("w1")),
            ("page_size".to_string(), n("64")),
            ("l2".to_string(), JsonValue::Bool(true)),
            ("x".to_string(), JsonValue::Null),
            ("ns_per_step".to_string(), n("12.5e0")),
            ("neg".to_string(), n("-3")),
            ("esc".to_string(), s("a\"b\\cA")),
        ];
        assert_eq!(fields.ok(), Some(expected));
    }

    #[test]
    fn keeps_nested_values_raw() {
        let fields = parse_flat_json(r#"{"a":[1,{"b":"]"}],"c":{"d":2},"e":1}"#).ok();
        assert_eq!(
            fields,
            Some(vec![
                (
                    "a".to_string(),
                    JsonValue::Nested(r#"[1,{"b":"]"}]"#.to_string())
                ),
                ("c".to_string(), JsonValue::Nested(r#"{"d":2}"#.to_string())),
                ("e".to_string(), n("1")),
            ])
        );
    }

    #[test]
    fn empty_object() {
        assert_eq!(parse_flat_json("{}").ok(), Some(vec![]));
    }

    #[test]
    fn rejects_malformed_json() {
        for bad in [
            "",
            "[1]",
            "{\"a\":1",
            "{\"a\" 1}",
            "{\"a\":1,}",
            "{\"a\":tru}",
            "{\"a\":1} x",
            "{\"a\":\"x}",
            "{a:1}",
            "{\"a\":1.2.3}",
            "Compiling kvtier",
        ] {
            assert!(parse_flat_json(bad).is_err(), "{bad}");
        }
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
        let both = vec![
            ("finished".to_string(), n("10")),
            ("callgrind_divisor".to_string(), n("4")),
        ];
        assert_eq!(divisor(&both), Some(("callgrind_divisor", 4.0)));
        let finished = vec![("finished".to_string(), n("10"))];
        assert_eq!(divisor(&finished), Some(("finished", 10.0)));
        let zero = vec![("finished".to_string(), n("0"))];
        assert_eq!(divisor(&zero), None);
        assert_eq!(divisor(&[]), None);
    }

    #[test]
    fn table_shows_selected_fields() {
        let rows = vec![
            (
                "w1 --page-size 64".to_string(),
                vec![
                    ("workload".to_string(), s("w1")),
                    ("page_size".to_string(), n("64")),
                    ("ns_per_request".to_string(), n("812.345")),
                    ("ignored".to_string(), n("1")),
                ],
            ),
            (
                "w3".to_string(),
                vec![
                    ("steps".to_string(), n("1000")),
                    ("ns_per_step".to_string(), n("45")),
                ],
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
