//! `cargo xtask test [CRATE..]`: the contributor's inner loop. The unit and integration
//! tests of the named crates (`radix` or `kvtier-radix`; none: the whole workspace) with
//! plain `cargo test`, and nothing from outside: no nextest, no Mooncake master, no
//! Python, no third-party receivers. Tests that need those say loudly that they skipped
//! (`cargo xtask ci` runs them all).

use std::path::Path;

use anyhow::{Result, bail};

use crate::{cargo, run_command};

pub fn run(root: &Path, crates: &[String]) -> Result<()> {
    let mut test = cargo(root);
    test.arg("test");
    if crates.is_empty() {
        test.arg("--workspace");
    }
    for name in crates {
        if name.starts_with('-') {
            bail!("`cargo xtask test` takes crate names (e.g. `radix`), got `{name}`");
        }
        test.args(["-p", &package(root, name)?]);
    }
    // The third-party tools' tests skip instead of failing, even in a CI shell.
    test.env_remove("CI");
    run_command(&mut test)
}

/// The workspace member a short or full name means.
fn package(root: &Path, name: &str) -> Result<String> {
    let candidates = [name.to_string(), format!("kvtier-{name}")];
    for candidate in &candidates {
        if member_dirs(root).iter().any(|dir| dir == candidate) {
            return Ok(candidate.clone());
        }
    }
    bail!(
        "no crate `{name}` in the workspace (crates: {})",
        member_dirs(root).join(", ")
    )
}

/// The package names of the members under `crates/`, and the top-level ones.
fn member_dirs(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root.join("crates"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.path().join("Cargo.toml").is_file())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    names.extend(["xtask", "kvtier-tests", "kvtier-examples"].map(String::from));
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_full_names_mean_the_same_crate_and_others_are_refused() {
        let root = crate::repo_root();
        assert_eq!(
            package(&root, "radix").ok().as_deref(),
            Some("kvtier-radix")
        );
        assert_eq!(
            package(&root, "kvtier-radix").ok().as_deref(),
            Some("kvtier-radix")
        );
        assert_eq!(package(&root, "kvtier").ok().as_deref(), Some("kvtier"));
        let err = package(&root, "nosuch").expect_err("no such crate");
        assert!(err.to_string().contains("kvtier-fsm"), "{err}");
    }
}
