//! Rule `lib-doc`: every crate says what it is for, first thing in its `lib.rs`.

use anyhow::Result;

use super::{Repo, Violation, violation};

pub const NAME: &str = "lib-doc";

/// Every member's `src/lib.rs`.
pub fn check(repo: &Repo) -> Result<Vec<Violation>> {
    let mut violations = Vec::new();
    for manifest in repo.metadata().member_manifests()? {
        let Some(dir) = manifest.parent() else {
            continue;
        };
        let lib = dir.join("src").join("lib.rs");
        if lib.is_file() {
            let contents = repo.read(&lib)?;
            violations.extend(check_lib_doc(&repo.relative(&lib), &contents));
        }
    }
    Ok(violations)
}

/// A crate's `src/lib.rs` starts with a `//!` module doc comment (leading blank lines allowed).
/// Other paths are not checked.
pub fn check_lib_doc(path: &str, contents: &str) -> Vec<Violation> {
    if path != "src/lib.rs" && !path.ends_with("/src/lib.rs") {
        return Vec::new();
    }
    let first = contents
        .lines()
        .enumerate()
        .find(|(_, line)| !line.trim().is_empty());
    match first {
        Some((_, line)) if line.trim_start().starts_with("//!") => Vec::new(),
        Some((index, _)) => vec![violation(
            path,
            index + 1,
            NAME,
            "lib.rs must start with a `//!` module doc comment".to_string(),
        )],
        None => vec![violation(
            path,
            1,
            NAME,
            "lib.rs is empty; it must start with a `//!` module doc comment".to_string(),
        )],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tidy::rules;

    #[test]
    fn lib_doc_required() {
        let path = "crates/kvtier-fsm/src/lib.rs";
        assert!(check_lib_doc(path, "//! The state machine.\nmod a;\n").is_empty());
        assert!(check_lib_doc(path, "\n\n//! Doc after blank lines.\n").is_empty());
        assert_eq!(rules(&check_lib_doc(path, "mod a;\n")), vec![(1, NAME)]);
        assert_eq!(
            rules(&check_lib_doc(path, "\n/// outer doc\nmod a;\n")),
            vec![(2, NAME)]
        );
        assert_eq!(
            rules(&check_lib_doc(path, "#![deny(x)]\n//! late\n")),
            vec![(1, NAME)]
        );
        assert_eq!(rules(&check_lib_doc(path, "")), vec![(1, NAME)]);
        // Only lib.rs is checked.
        assert!(check_lib_doc("crates/kvtier-fsm/src/state.rs", "mod a;\n").is_empty());
        assert!(check_lib_doc("crates/kvtier-cli/src/main.rs", "fn main() {}\n").is_empty());
    }
}
