//! `cargo xtask ci`: the checks CI runs, in order, failing fast.
//!
//! The same steps run everywhere; nothing depends on `CI` being set.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result};

use crate::{cargo, display_command, run_command, tidy};

/// What one step does.
enum Action {
    /// Run this command.
    Command(Command),
    /// Run these commands in order.
    Commands(Vec<Command>),
    /// Run tidy in-process.
    Tidy,
    /// Make sure cargo-nextest is installed, then run this command.
    Nextest(Command),
    /// `cargo xtask py` in-process: the Python wheel and its tests.
    Python,
    /// Install nvcc from PyPI (`cargo xtask cuda-toolchain`), then run these commands
    /// with its `NVCC` and `CUDA_HOME`.
    Cuda(Vec<Command>),
}

struct Step {
    name: &'static str,
    action: Action,
}

pub fn run(root: &Path) -> Result<()> {
    let steps = steps(root);
    let total = steps.len();
    let started = Instant::now();
    for (index, step) in steps.into_iter().enumerate() {
        let description = match &step.action {
            Action::Command(command) | Action::Nextest(command) => display_command(command),
            Action::Tidy => "cargo xtask tidy (in-process)".to_string(),
            Action::Python => "cargo xtask py (in-process)".to_string(),
            Action::Commands(commands) => commands
                .iter()
                .map(display_command)
                .collect::<Vec<_>>()
                .join(" && "),
            Action::Cuda(commands) => std::iter::once("cargo xtask cuda-toolchain".to_string())
                .chain(commands.iter().map(display_command))
                .collect::<Vec<_>>()
                .join(" && "),
        };
        println!(
            "==> ci [{}/{total}] {}: {description}",
            index + 1,
            step.name
        );
        let step_started = Instant::now();
        let result = match step.action {
            Action::Command(mut command) => run_command(&mut command),
            Action::Tidy => tidy::run(root),
            Action::Python => crate::py::run(root, &[]),
            Action::Commands(mut commands) => commands.iter_mut().try_for_each(run_command),
            Action::Nextest(mut command) => {
                ensure_nextest(root).and_then(|()| run_with_mooncake(root, &mut command))
            }
            Action::Cuda(commands) => run_with_cuda_toolchain(root, commands),
        };
        let elapsed = step_started.elapsed().as_secs_f64();
        match &result {
            Ok(()) => println!("<== ci {}: ok in {elapsed:.1}s", step.name),
            Err(_) => println!("<== ci {}: FAILED after {elapsed:.1}s", step.name),
        }
        result.with_context(|| format!("ci step `{}` failed", step.name))?;
    }
    println!(
        "ci: all {total} steps passed in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn steps(root: &Path) -> Vec<Step> {
    let mut fmt = cargo(root);
    fmt.args(["fmt", "--all", "--", "--check"]);

    let mut clippy = cargo(root);
    clippy.args(["clippy", "--workspace", "--all-targets"]);
    if root.join("Cargo.lock").is_file() {
        clippy.arg("--locked");
    }
    clippy.args(["--", "-D", "warnings"]);

    let mut nextest = cargo(root);
    nextest.args([
        "nextest",
        "run",
        "--workspace",
        "--all-targets",
        "--no-fail-fast",
    ]);

    let mut doc = cargo(root);
    doc.args(["test", "--workspace", "--doc"]);

    // The CUDA backend: it builds, lints clean, and its probe test passes (on a machine
    // without a GPU: the probe's typed error; the GPU tests report themselves skipped).
    let locked = root.join("Cargo.lock").is_file();
    let mut cuda_build = cargo(root);
    cuda_build.args(["build", "-p", "kvtier-device", "--features", "cuda"]);
    let mut cuda_clippy = cargo(root);
    cuda_clippy.args([
        "clippy",
        "-p",
        "kvtier-device",
        "--features",
        "cuda",
        "--all-targets",
    ]);
    let mut cuda_test = cargo(root);
    cuda_test.args([
        "test",
        "-p",
        "kvtier-device",
        "--features",
        "cuda",
        "--test",
        "cuda_probe",
    ]);
    for command in [&mut cuda_build, &mut cuda_clippy, &mut cuda_test] {
        if locked {
            command.arg("--locked");
        }
    }
    cuda_clippy.args(["--", "-D", "warnings"]);

    // Every example of the top-level `examples/` member, built and run.
    let examples: Vec<Command> = example_names(root)
        .into_iter()
        .map(|name| {
            let mut run = cargo(root);
            run.args(["run", "-p", "kvtier-examples", "--example", &name]);
            if locked {
                run.arg("--locked");
            }
            run
        })
        .collect();

    vec![
        Step {
            name: "fmt",
            action: Action::Command(fmt),
        },
        Step {
            name: "clippy",
            action: Action::Command(clippy),
        },
        Step {
            name: "tidy",
            action: Action::Tidy,
        },
        Step {
            name: "test",
            action: Action::Nextest(nextest),
        },
        Step {
            name: "doctest",
            action: Action::Command(doc),
        },
        Step {
            name: "examples",
            action: Action::Commands(examples),
        },
        Step {
            name: "python",
            action: Action::Python,
        },
        Step {
            name: "cuda",
            action: Action::Cuda(vec![cuda_build, cuda_clippy, cuda_test]),
        },
    ]
}

/// The examples of `examples/`: one `NAME.rs` file each beside its `lib.rs`.
fn example_names(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root.join("examples"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let path = entry.path();
            let stem = path.file_stem()?.to_str()?.to_string();
            (path.extension()? == "rs" && stem != "lib").then_some(stem)
        })
        .collect();
    names.sort();
    names
}

/// Installs cargo-nextest when `cargo nextest --version` does not succeed.
fn ensure_nextest(root: &Path) -> Result<()> {
    let mut probe = cargo(root);
    probe
        .args(["nextest", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if probe.status().is_ok_and(|status| status.success()) {
        return Ok(());
    }
    let mut install = cargo(root);
    install.args(["install", "cargo-nextest", "--locked"]);
    println!(
        "cargo-nextest not found; installing it: {}",
        display_command(&install)
    );
    run_command(&mut install).context("could not install cargo-nextest")
}

/// Runs the tests with a real Mooncake master on loopback, both in a private network
/// namespace (`cargo xtask mooncake run`); the master stops with them whatever happens.
/// Without CI a failed setup is reported and the Mooncake tests skip loudly; under CI
/// (`CI=true`) it fails the step, so a missing install cannot hide.
fn run_with_mooncake(root: &Path, command: &mut Command) -> Result<()> {
    // Tests check kvtier's output with third-party tools: the Prometheus text with the
    // real `promtool`, the KV event wire with libzmq's own Python bindings and with
    // Dynamo's KV indexer, the spans with a real OTLP receiver.
    let tools: [(&str, &str, crate::tools::Prepare); 4] = [
        ("KVTIER_PROMTOOL", "promtool", crate::tools::promtool),
        ("KVTIER_PYZMQ_PYTHON", "pyzmq", crate::tools::pyzmq_python),
        (
            "KVTIER_OTELTAP_PYTHON",
            "oteltap",
            crate::tools::oteltap_python,
        ),
        (
            "KVTIER_DYNAMO_PYTHON",
            "Dynamo's KV indexer",
            crate::tools::dynamo_python,
        ),
    ];
    for (var, what, prepare) in tools {
        match prepare(root) {
            Ok(path) => {
                command.env(var, path);
            }
            Err(err) if std::env::var("CI").is_ok_and(|v| v == "true") => {
                return Err(err.context(format!("setting up {what} for the tests")));
            }
            Err(err) => eprintln!("WARNING: {what} setup failed, its tests will skip: {err:#}"),
        }
    }
    match crate::mooncake::prepare(root) {
        Ok(installed) => crate::mooncake::run_isolated(&installed, command),
        Err(err) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            Err(err.context("setting up Mooncake for the L3 tests"))
        }
        Err(err) => {
            eprintln!("WARNING: Mooncake setup failed, its tests will skip: {err:#}");
            run_command(command)
        }
    }
}

/// Installs nvcc from PyPI into `target/cuda-venv` (cached there), then runs `commands`
/// with its `NVCC` and `CUDA_HOME`. Without CI a failed install is reported and the CUDA
/// backend is loudly left unbuilt; under CI (`CI=true`) it fails the step, so a missing
/// nvcc cannot hide.
fn run_with_cuda_toolchain(root: &Path, commands: Vec<Command>) -> Result<()> {
    let toolchain = match crate::cuda::install(root) {
        Ok(toolchain) => toolchain,
        Err(err) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            return Err(err.context("installing nvcc for the CUDA backend"));
        }
        Err(err) => {
            eprintln!(
                "WARNING: SKIPPED: the CUDA backend was not built or tested, nvcc could not be \
                 installed: {err:#}"
            );
            return Ok(());
        }
    };
    println!(
        "cuda: {} at {}",
        toolchain.version,
        toolchain.nvcc.display()
    );
    for mut command in commands {
        command.envs(toolchain.env());
        println!("--> {}", display_command(&command));
        run_command(&mut command)?;
    }
    Ok(())
}
