//! `cargo xtask dashboards`: a real trace UI on loopback with a replay's spans in it.
//!
//! Starts Arize Phoenix (PyPI `arize-phoenix`, in `target/tools/phoenix-venv`) on
//! 127.0.0.1 — its OTLP gRPC receiver, which has no address setting, made to bind
//! loopback by `tools/phoenix/sitecustomize.py` — then runs `kvtier replay` exporting
//! its spans there (`--otlp-endpoint`, project `kvtier`) and writing the HTML report,
//! and prints where to look. It keeps Phoenix up until interrupted, or, with
//! `--screenshots`, takes the trace view's and the report's pictures in headless
//! Chromium into `docs/images/` and stops.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{cargo, run_command};

/// Requests the replay sends through (enough for a view; a minute on two cores).
const REQUESTS: &str = "300";

/// The headless browser (Debian's `chromium` package).
const CHROMIUM: &str = "/usr/lib/chromium/chromium";

pub fn run(root: &Path, rest: &[String]) -> Result<()> {
    let screenshots = match rest {
        [] => false,
        [flag] if flag == "--screenshots" => true,
        _ => bail!("usage: cargo xtask dashboards [--screenshots]"),
    };
    let python = crate::tools::phoenix_python(root)?;
    let (http, grpc) = (free_port()?, free_port()?);
    let data = root.join("target/dashboards");
    std::fs::create_dir_all(&data).context("creating target/dashboards")?;
    let phoenix = Phoenix::start(root, &python, http, grpc, &data)?;
    println!("Phoenix: http://127.0.0.1:{http}/ (OTLP/HTTP at /v1/traces)");

    let report = data.join("report.html");
    let mut replay = cargo(root);
    replay
        .args(["run", "--release", "--", "replay", "--limit", REQUESTS])
        .arg("--otlp-endpoint")
        .arg(format!("http://127.0.0.1:{http}"))
        .arg("--report")
        .arg(&report)
        .env(
            "OTEL_RESOURCE_ATTRIBUTES",
            "openinference.project.name=kvtier",
        );
    run_command(&mut replay).context("the replay")?;
    let project = phoenix.project_id("kvtier")?;
    let traces = format!("http://127.0.0.1:{http}/projects/{project}/traces");
    println!("traces: {traces}\nreport: {}", report.display());
    if screenshots {
        let images = root.join("docs/images");
        std::fs::create_dir_all(&images).context("creating docs/images")?;
        let trace = phoenix.a_request_trace(&project)?;
        shoot(
            &format!("{traces}/{trace}"),
            &images.join("phoenix-request-trace.png"),
            1600,
            1000,
        )?;
        shoot(&traces, &images.join("phoenix-traces.png"), 1600, 1000)?;
        shoot(
            &format!("file://{}", report.display()),
            &images.join("replay-report.png"),
            1280,
            1100,
        )?;
        println!("screenshots in {}", images.display());
        return Ok(());
    }
    println!("Phoenix keeps running; stop it with Ctrl-C.");
    phoenix.wait()
}

/// A loopback port nothing listens on now.
fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// A running Phoenix; stopped when dropped.
struct Phoenix {
    child: Child,
    http: u16,
}

impl Phoenix {
    fn start(root: &Path, python: &Path, http: u16, grpc: u16, data: &Path) -> Result<Self> {
        let log = std::fs::File::create(data.join("phoenix.log"))?;
        let child = Command::new(python.with_file_name("phoenix"))
            .arg("serve")
            .env("PHOENIX_HOST", "127.0.0.1")
            .env("PHOENIX_PORT", http.to_string())
            .env("PHOENIX_GRPC_PORT", grpc.to_string())
            .env("PHOENIX_WORKING_DIR", data.join("phoenix"))
            .env("PHOENIX_TELEMETRY_ENABLED", "false")
            .env("PHOENIX_ALLOW_EXTERNAL_RESOURCES", "false")
            .env("PYTHONPATH", root.join("tools/phoenix"))
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting phoenix serve")?;
        let mut phoenix = Self { child, http };
        let started = Instant::now();
        while phoenix.get("/healthz").is_err() {
            if let Some(status) = phoenix.child.try_wait()? {
                bail!("Phoenix exited ({status}); see target/dashboards/phoenix.log");
            }
            if started.elapsed() > Duration::from_secs(180) {
                bail!("Phoenix did not answer /healthz in 180 s");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(phoenix)
    }

    /// GET `path` from Phoenix's HTTP API (curl: no HTTP client in xtask).
    fn get(&self, path: &str) -> Result<serde_json::Value> {
        let out = Command::new("curl")
            .args(["-sf", &format!("http://127.0.0.1:{}{path}", self.http)])
            .stderr(Stdio::null())
            .output()
            .context("running curl")?;
        if !out.status.success() {
            bail!("GET {path} failed");
        }
        Ok(serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null))
    }

    /// The id of the project named `name` (the UI's URLs use it).
    fn project_id(&self, name: &str) -> Result<String> {
        let projects = self.get("/v1/projects")?;
        projects["data"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == name)
            .and_then(|p| p["id"].as_str())
            .map(str::to_owned)
            .with_context(|| format!("no project {name} in {projects}"))
    }

    /// The trace id of one request that went through every phase, prefetch included if
    /// any did (the most spans).
    fn a_request_trace(&self, project: &str) -> Result<String> {
        let spans = self.get(&format!("/v1/projects/{project}/spans?limit=1000"))?;
        let mut per_trace = std::collections::BTreeMap::<String, usize>::new();
        for span in spans["data"].as_array().into_iter().flatten() {
            if let Some(trace) = span["context"]["trace_id"].as_str() {
                *per_trace.entry(trace.to_owned()).or_default() += 1;
            }
        }
        per_trace
            .into_iter()
            .max_by_key(|&(_, n)| n)
            .map(|(trace, _)| trace)
            .context("Phoenix has no spans")
    }

    fn wait(mut self) -> Result<()> {
        self.child.wait()?;
        Ok(())
    }
}

impl Drop for Phoenix {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A PNG of `url` as headless Chromium renders it (JavaScript pages get 15 s of
/// virtual time to draw).
fn shoot(url: &str, png: &Path, width: u32, height: u32) -> Result<()> {
    if !Path::new(CHROMIUM).is_file() {
        bail!("{CHROMIUM} is missing: `apt-get install chromium`");
    }
    let profile = std::env::temp_dir().join(format!("kvtier-chromium-{}", std::process::id()));
    let mut chromium = Command::new(CHROMIUM);
    chromium
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
        ])
        .args(["--no-first-run", "--virtual-time-budget=15000"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--window-size={width},{height}"))
        .arg(format!("--screenshot={}", png.display()))
        .arg(url)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    run_command(&mut chromium).with_context(|| format!("screenshot of {url}"))
}
