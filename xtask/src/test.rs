//! `cargo xtask test [CRATE..]`: the contributor's inner loop. The unit and integration
//! tests of the named crates (`radix` or `kvtier-radix`; none: the whole workspace) with
//! plain `cargo test`, and nothing from outside: no nextest, no Mooncake master, no
//! Python, no third-party receivers. Tests that need those say loudly that they skipped
//! (`cargo xtask ci` runs them all).

use std::path::Path;

use anyhow::{Context, Result};

use crate::tidy::metadata;
use crate::{capture_stdout, cargo, run_command};

pub fn run(root: &Path, crates: &[String]) -> Result<()> {
    let mut test = cargo(root);
    test.arg("test");
    if crates.is_empty() {
        test.arg("--workspace");
    } else {
        let members = members(root)?;
        for name in crates {
            test.args(["-p", &package(&members, name)?]);
        }
    }
    // The third-party tools' tests skip instead of failing, even in a CI shell.
    test.env_remove("CI");
    run_command(&mut test)
}

/// The workspace members' package names, from `cargo metadata`.
fn members(root: &Path) -> Result<Vec<String>> {
    let json =
        capture_stdout(cargo(root).args(["metadata", "--no-deps", "--format-version", "1"]))?;
    let metadata = metadata::parse(&json)?;
    Ok(metadata
        .members()?
        .into_iter()
        .map(|p| p.name.clone())
        .collect())
}

/// The member a short (`radix`) or full (`kvtier-radix`) name means.
fn package(members: &[String], name: &str) -> Result<String> {
    [name.to_string(), format!("kvtier-{name}")]
        .into_iter()
        .find(|candidate| members.contains(candidate))
        .with_context(|| {
            format!(
                "no crate `{name}` in the workspace (crates: {})",
                members.join(", ")
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_full_names_mean_the_same_crate_and_others_are_refused() {
        let members = members(&crate::repo_root()).expect("cargo metadata");
        let found = |name| package(&members, name).ok();
        assert_eq!(found("radix").as_deref(), Some("kvtier-radix"));
        assert_eq!(found("kvtier-radix").as_deref(), Some("kvtier-radix"));
        assert_eq!(found("kvtier").as_deref(), Some("kvtier"));
        let err = package(&members, "nosuch").expect_err("no such crate");
        assert!(err.to_string().contains("kvtier-fsm"), "{err}");
    }
}
