//! `cargo xtask campaign`: the seeded campaign (docs/campaign.md), through the release
//! `kvtier` binary.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{cargo, display_command, run_command};

const USAGE: &str = "usage: cargo xtask campaign --seeds N [--from S] [--jobs J] \
                     [--shrink-budget B] [--json]";

/// Builds `kvtier-cli` in release and runs `kvtier campaign` with the arguments given.
pub fn run(root: &Path, args: &[String]) -> Result<()> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return Ok(());
    }
    check_args(args)?;
    let mut build = cargo(root);
    build.args(["build", "--release", "-p", "kvtier-cli"]);
    println!("==> campaign: {}", display_command(&build));
    run_command(&mut build)?;
    let binary = root
        .join(crate::bench::target_dir())
        .join("release")
        .join("kvtier");
    let mut command = Command::new(&binary);
    command.current_dir(root).arg("campaign").args(args);
    // The L3 store of every run writes one file per page: on tmpfs that costs nothing,
    // on a disk it is most of the campaign's time.
    let shm = Path::new("/dev/shm");
    if std::env::var_os("TMPDIR").is_none() && shm.is_dir() {
        command.env("TMPDIR", shm);
        println!(
            "==> campaign: TMPDIR=/dev/shm {}",
            display_command(&command)
        );
    } else {
        println!("==> campaign: {}", display_command(&command));
    }
    run_command(&mut command).context("the campaign failed")
}

/// `--seeds` is required; everything else is the binary's to check.
fn check_args(args: &[String]) -> Result<()> {
    if !args
        .iter()
        .any(|a| a == "--seeds" || a.starts_with("--seeds="))
    {
        bail!("--seeds is required\n{USAGE}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn seeds_are_required() {
        assert!(check_args(&args("--seeds 10")).is_ok());
        assert!(check_args(&args("--seeds=10 --from 5 --json")).is_ok());
        assert!(check_args(&args("--from 5")).is_err());
        assert!(check_args(&[]).is_err());
    }
}
