//! Repository tooling for kvtier: `cargo xtask <ci|test|tidy|bench|campaign|…>`.
//!
//! See `docs/xtask.md` for what each subcommand does.

mod bench;
mod campaign;
mod ci;
mod cuda;
mod dashboards;
mod mooncake;
mod py;
mod test;
mod tidy;
mod tools;

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Result, bail};

const USAGE: &str = "\
usage: cargo xtask <command>

commands:
  ci                              fmt check, clippy, tidy, nextest, doc tests (fail fast)
  test [CRATE..]                  the inner loop: `cargo test` of the named crates (`radix`,
                                  `kvtier-fsm`, ..; none: all), without the third-party tools
  tidy                            repository rules (see docs/xtask.md)
  bench [--quick] [--no-criterion]
                                  kvtier CLI bench workloads, then `cargo bench --workspace`
  bench --callgrind <w> [args..]  instruction counts of one workload under callgrind
  campaign --seeds N [--from S]   the seeded campaign through the release kvtier binary
  mooncake run -- CMD             CMD beside a real Mooncake master, in a private network namespace
  cuda-toolchain                  nvcc from PyPI into target/cuda-venv; prints NVCC/CUDA_HOME
  dashboards [--screenshots]      Arize Phoenix on loopback with a replay's traces, and the
                                  replay's HTML report (--screenshots: into docs/images)
  py [--release] [--bench] [--seeds N]
                                  the Python wheel (maturin), its tests, the differential run
                                  against the reference wheel, the Python example
  help                            this message";

fn main() -> ExitCode {
    match run_cli() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            // Pass a failed child's exit code through (found even under added context).
            let code = err
                .downcast_ref::<CommandFailed>()
                .and_then(|failed| failed.code)
                .and_then(|code| u8::try_from(code).ok())
                .filter(|&code| code != 0)
                .unwrap_or(1);
            ExitCode::from(code)
        }
    }
}

fn run_cli() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let command = args.next();
    let rest: Vec<String> = args.collect();
    let root = repo_root();
    match command.as_deref() {
        Some("ci") => {
            no_extra_args("ci", &rest)?;
            ci::run(&root)
        }
        Some("test") => test::run(&root, &rest),
        Some("tidy") => {
            no_extra_args("tidy", &rest)?;
            tidy::run(&root)
        }
        Some("bench") => bench::run(&root, &rest),
        Some("campaign") => campaign::run(&root, &rest),
        Some("mooncake") => mooncake::run(&root, &rest),
        Some("cuda-toolchain") => cuda::run(&root, &rest),
        Some("dashboards") => dashboards::run(&root, &rest),
        Some("py") => py::run(&root, &rest),
        Some("help" | "-h" | "--help") => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => bail!("unknown command `{other}`\n\n{USAGE}"),
        None => bail!("no command given\n\n{USAGE}"),
    }
}

fn no_extra_args(command: &str, rest: &[String]) -> Result<()> {
    if rest.is_empty() {
        Ok(())
    } else {
        bail!(
            "`cargo xtask {command}` takes no arguments, got: {}",
            rest.join(" ")
        )
    }
}

/// The workspace root: the parent of this crate's directory.
fn repo_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map_or_else(|| manifest_dir.to_path_buf(), Path::to_path_buf)
}

/// A `cargo` command: the same cargo that runs us when started through `cargo xtask`.
fn cargo(root: &Path) -> Command {
    let program = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut command = Command::new(program);
    command.current_dir(root);
    command
}

/// Human-readable rendering of a command line, for headers and error messages.
/// A cargo found through `$CARGO` is shown as plain `cargo`.
fn display_command(command: &Command) -> String {
    let program = Path::new(command.get_program());
    let program = match program.file_stem().and_then(|stem| stem.to_str()) {
        Some("cargo") => "cargo".to_string(),
        _ => program.to_string_lossy().into_owned(),
    };
    let mut line = program;
    for arg in command.get_args() {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}

/// A child process that could not be started or exited unsuccessfully.
#[derive(Debug)]
struct CommandFailed {
    command: String,
    /// The exit code; `None` when it did not start or was killed by a signal.
    code: Option<i32>,
    detail: String,
}

impl fmt::Display for CommandFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` {}", self.command, self.detail)
    }
}

impl std::error::Error for CommandFailed {}

fn check_status(command: &Command, status: std::process::ExitStatus) -> Result<()> {
    if status.success() {
        return Ok(());
    }
    let detail = match status.code() {
        Some(code) => format!("exited with code {code}"),
        None => format!("was terminated ({status})"),
    };
    Err(CommandFailed {
        command: display_command(command),
        code: status.code(),
        detail,
    }
    .into())
}

fn spawn_failed(command: &Command, err: &std::io::Error) -> anyhow::Error {
    CommandFailed {
        command: display_command(command),
        code: None,
        detail: format!("could not be started: {err}"),
    }
    .into()
}

/// Runs a command with inherited stdio; an error if it fails to start or exits non-zero.
fn run_command(command: &mut Command) -> Result<()> {
    let status = command
        .status()
        .map_err(|err| spawn_failed(command, &err))?;
    check_status(command, status)
}

/// Runs a command with stdout captured (stderr inherited) and returns stdout.
fn capture_stdout(command: &mut Command) -> Result<String> {
    command.stdout(std::process::Stdio::piped());
    command.stderr(std::process::Stdio::inherit());
    let output = command
        .output()
        .map_err(|err| spawn_failed(command, &err))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        // Show what it printed before failing: it may explain why.
        print!("{stdout}");
    }
    check_status(command, output.status)?;
    Ok(stdout)
}
