//! Rule `bincode-pinned`: bincode 3.0.0 is a tombstone that does not compile, so every
//! manifest pins the complete 2.0.1 exactly.

use anyhow::{Context, Result};

use super::manifest::dependencies;
use super::{Repo, Violation, violation};

pub const NAME: &str = "bincode-pinned";

/// The exact version requirement bincode must be pinned to.
pub const BINCODE_PIN: &str = "=2.0.1";

/// The root manifest and every member's.
pub fn check(repo: &Repo) -> Result<Vec<Violation>> {
    let root_manifest_path = repo.root().join("Cargo.toml");
    let root_manifest = repo.read(&root_manifest_path)?;
    let root_pins = root_pins_bincode_exactly(&root_manifest)
        .with_context(|| format!("parsing {}", root_manifest_path.display()))?;
    let mut manifests = vec![root_manifest_path];
    for manifest in repo.metadata().member_manifests()? {
        if !manifests.contains(&manifest) {
            manifests.push(manifest);
        }
    }
    let mut violations = Vec::new();
    for manifest in &manifests {
        let contents = repo.read(manifest)?;
        violations.extend(
            check_bincode(&repo.relative(manifest), &contents, root_pins)
                .with_context(|| format!("parsing {}", manifest.display()))?,
        );
    }
    Ok(violations)
}

/// Whether the root manifest pins bincode exactly in `[workspace.dependencies]`.
pub fn root_pins_bincode_exactly(root_manifest: &str) -> Result<bool> {
    Ok(dependencies(root_manifest)?.iter().any(|dep| {
        dep.table == "workspace.dependencies"
            && dep.is_bincode()
            && dep.version.as_deref() == Some(BINCODE_PIN)
    }))
}

/// bincode, wherever it is a dependency, is pinned exactly to [`BINCODE_PIN`]
/// (directly, or through `workspace = true` when `root_pins_exactly`).
/// An error if `manifest` is not valid TOML.
pub fn check_bincode(
    path: &str,
    manifest: &str,
    root_pins_exactly: bool,
) -> Result<Vec<Violation>> {
    let mut violations = Vec::new();
    for dep in dependencies(manifest)?
        .iter()
        .filter(|dep| dep.is_bincode())
    {
        let problem = match &dep.version {
            Some(version) if version == BINCODE_PIN => None,
            Some(version) => Some(format!(
                "bincode in [{}] must be pinned exactly \"{BINCODE_PIN}\", found \"{version}\"",
                dep.table
            )),
            None if dep.workspace && root_pins_exactly => None,
            None if dep.workspace => Some(format!(
                "bincode in [{}] is inherited from the workspace, but the root Cargo.toml does \
                 not pin bincode = \"{BINCODE_PIN}\" in [workspace.dependencies]",
                dep.table
            )),
            None => Some(format!(
                "bincode in [{}] has no version; pin it exactly \"{BINCODE_PIN}\"",
                dep.table
            )),
        };
        if let Some(message) = problem {
            violations.push(violation(path, dep.line, NAME, message));
        }
    }
    Ok(violations)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tidy::rules;

    // --- bincode ---

    const ROOT_PINNED: &str = "\
[workspace]
members = [\"crates/a\"]

[workspace.dependencies]
serde = { version = \"1\", features = [\"derive\"] }
bincode = { version = \"=2.0.1\", default-features = false, features = [\"std\", \"serde\"] } # pinned
";

    #[test]
    fn root_pin_detection() {
        assert!(root_pins(ROOT_PINNED));
        assert!(root_pins(
            "[workspace.dependencies]\nbincode = \"=2.0.1\"\n"
        ));
        assert!(root_pins(
            "[workspace.dependencies.bincode]\nversion = \"=2.0.1\"\nfeatures = [\n  \"serde\",\n]\n"
        ));
        assert!(!root_pins(
            "[workspace.dependencies]\nbincode = \"2.0.1\"\n"
        ));
        assert!(!root_pins("[workspace.dependencies]\nserde = \"1\"\n"));
        // A pin in a member-style table is not a workspace pin.
        assert!(!root_pins("[dependencies]\nbincode = \"=2.0.1\"\n"));
    }

    #[test]
    fn exact_pins_pass() {
        for manifest in [
            ROOT_PINNED,
            "[dependencies]\nbincode = \"=2.0.1\"\n",
            "[dependencies]\nbincode = { version = \"=2.0.1\", features = [\"serde\"] }\n",
            "[dev-dependencies]\nbincode = '=2.0.1'\n",
            "[dependencies.bincode]\nversion = \"=2.0.1\"\ndefault-features = false\n",
            "[target.'cfg(unix)'.dependencies]\nbincode = \"=2.0.1\"\n",
            "[dependencies]\nbincode.version = \"=2.0.1\"\nbincode.features = [\"serde\"]\n",
            "[dependencies]\nserde = \"1\"\n",
            // Not a dependency table.
            "[package]\nname = \"bincode\"\nversion = \"0.1.0\"\n",
        ] {
            assert!(
                bincode("Cargo.toml", manifest, false).is_empty(),
                "{manifest}"
            );
        }
    }

    #[test]
    fn loose_pins_fail() {
        for (manifest, line) in [
            ("[dependencies]\nbincode = \"2.0.1\"\n", 2),
            ("[dependencies]\nbincode = \"2\"\n", 2),
            ("[dependencies]\nbincode = \"=2.0.0\"\n", 2),
            ("[dependencies]\nbincode = \"= 2.0.1\"\n", 2),
            (
                "[package]\nname = \"a\"\n\n[dependencies]\nbincode = { version = \"2.0\", features = [\"serde\"] }\n",
                5,
            ),
            ("[dependencies.bincode]\nversion = \"^2.0.1\"\n", 1),
            (
                "[build-dependencies]\nbincode = { path = \"../bincode\" }\n",
                2,
            ),
            ("[workspace.dependencies]\nbincode = \"2\"\n", 2),
            (
                "[dependencies]\nbin = { package = \"bincode\", version = \"2\" }\n",
                2,
            ),
            (
                "[target.x86_64-unknown-linux-gnu.dev-dependencies]\nbincode = \"1\"\n",
                2,
            ),
        ] {
            let v = bincode("crates/a/Cargo.toml", manifest, true);
            assert_eq!(rules(&v), vec![(line, NAME)], "{manifest}");
        }
    }

    #[test]
    fn workspace_inheritance_depends_on_root_pin() {
        for manifest in [
            "[dependencies]\nbincode.workspace = true\n",
            "[dependencies]\nbincode = { workspace = true, features = [\"serde\"] }\n",
            "[dependencies.bincode]\nworkspace = true\n",
        ] {
            assert!(
                bincode("crates/a/Cargo.toml", manifest, true).is_empty(),
                "{manifest}"
            );
            let v = bincode("crates/a/Cargo.toml", manifest, false);
            assert_eq!(v.len(), 1, "{manifest}");
            assert!(v[0].message.contains("inherited"));
        }
    }

    fn bincode(path: &str, manifest: &str, root_pins_exactly: bool) -> Vec<Violation> {
        check_bincode(path, manifest, root_pins_exactly).expect("valid TOML")
    }

    fn root_pins(manifest: &str) -> bool {
        root_pins_bincode_exactly(manifest).expect("valid TOML")
    }

    #[test]
    fn invalid_manifest_is_an_error() {
        assert!(
            check_bincode(
                "Cargo.toml",
                "[dependencies
bincode = \"2\"\n",
                true
            )
            .is_err()
        );
        assert!(root_pins_bincode_exactly("[workspace.dependencies]\nbincode = \n").is_err());
    }
}
