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
    /// Run tidy in-process.
    Tidy,
    /// Make sure cargo-nextest is installed, then run this command.
    Nextest(Command),
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
            Action::Nextest(mut command) => {
                ensure_nextest(root).and_then(|()| run_with_mooncake(root, &mut command))
            }
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
    ]
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

/// Runs the tests with a real Mooncake master on loopback, stopping it afterwards
/// whatever happens. Without CI a failed setup is reported and the Mooncake tests skip
/// loudly; under CI (`CI=true`) it fails the step, so a missing install cannot hide.
fn run_with_mooncake(root: &Path, command: &mut Command) -> Result<()> {
    match crate::mooncake::up(root).and_then(|()| crate::mooncake::env(root)) {
        Ok(env) => {
            command.envs(env);
        }
        Err(err) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            return Err(err.context("setting up Mooncake for the L3 tests"));
        }
        Err(err) => {
            eprintln!("WARNING: Mooncake setup failed, its tests will skip: {err:#}");
        }
    }
    let result = run_command(command);
    crate::mooncake::down(root)?;
    result
}
