//! `cargo xtask tidy`: repository rules that rustc and clippy do not check.
//!
//! Each rule is one file: a pure function of its input (a parsed `cargo metadata`
//! document, a manifest, or a repository-relative path with `/` separators and the
//! file's contents) to the violations found, so each can be unit-tested, and a `check`
//! that applies it to the repository. [`RULES`] is the list; [`run`] reads the
//! repository once ([`Repo`]), applies every rule and prints `path:line: rule: message`.
//!
//! Rules that clippy enforces live in `[workspace.lints.clippy]` of the root
//! `Cargo.toml` instead (`dbg_macro`, `unwrap_used`).

mod bincode_pinned;
mod file_size;
mod inventory;
mod layering;
mod lib_doc;
mod manifest;
pub mod metadata;
mod module_cycles;
mod no_runtime_in_core;
mod source;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use anyhow::{Context, Result, bail};

use crate::{capture_stdout, cargo};
use metadata::Metadata;

/// One rule: its name (printed with each violation) and its check of the repository.
pub struct Rule {
    pub name: &'static str,
    pub check: fn(&Repo) -> Result<Vec<Violation>>,
}

/// Every rule, in the order they run.
pub const RULES: &[Rule] = &[
    Rule {
        name: no_runtime_in_core::NAME,
        check: no_runtime_in_core::check,
    },
    Rule {
        name: layering::NAME,
        check: layering::check,
    },
    Rule {
        name: bincode_pinned::NAME,
        check: bincode_pinned::check,
    },
    Rule {
        name: lib_doc::NAME,
        check: lib_doc::check,
    },
    Rule {
        name: module_cycles::NAME,
        check: module_cycles::check,
    },
    Rule {
        name: file_size::NAME,
        check: file_size::check,
    },
    Rule {
        name: inventory::NAME,
        check: inventory::check,
    },
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub path: String,
    /// 1-based line number.
    pub line: usize,
    pub rule: &'static str,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: {}: {}",
            self.path, self.line, self.rule, self.message
        )
    }
}

fn violation(path: &str, line: usize, rule: &'static str, message: String) -> Violation {
    Violation {
        path: path.to_string(),
        line,
        rule,
        message,
    }
}

/// The repository as the rules see it: the workspace's `cargo metadata`, and its files,
/// each read once through [`Repo::read`] (several rules read the same sources), which
/// also counts the files checked.
pub struct Repo {
    metadata: Metadata,
    read: RefCell<BTreeMap<PathBuf, Rc<str>>>,
}

impl Repo {
    fn load(root: &Path) -> Result<Self> {
        let json = capture_stdout(cargo(root).args([
            "metadata",
            "--format-version",
            "1",
            "--all-features",
        ]))?;
        Ok(Self {
            metadata: metadata::parse(&json)?,
            read: RefCell::default(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.metadata.workspace_root
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The contents of `path`, counted as checked.
    pub fn read(&self, path: &Path) -> Result<Rc<str>> {
        if let Some(contents) = self.read.borrow().get(path) {
            return Ok(Rc::clone(contents));
        }
        let contents: Rc<str> = fs::read_to_string(path)
            .with_context(|| format!("reading {}", path.display()))?
            .into();
        self.read
            .borrow_mut()
            .insert(path.to_path_buf(), Rc::clone(&contents));
        Ok(contents)
    }

    /// `path` relative to the workspace root, with `/` separators.
    pub fn relative(&self, path: &Path) -> String {
        relative(self.root(), path)
    }

    /// The `.rs` files under `dir`, recursively and sorted, skipping build output.
    pub fn rust_files(&self, dir: &Path) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let mut pending = vec![dir.to_path_buf()];
        while let Some(dir) = pending.pop() {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for path in entries.flatten().map(|entry| entry.path()) {
                if path.is_dir() {
                    if path.file_name().is_some_and(|name| name != "target") {
                        pending.push(path);
                    }
                } else if path.extension().is_some_and(|ext| ext == "rs") {
                    found.push(path);
                }
            }
        }
        found.sort();
        found
    }
}

/// Runs every rule over the repository at `root`; an error if anything is violated.
pub fn run(root: &Path) -> Result<()> {
    let repo = Repo::load(root)?;
    let mut violations = Vec::new();
    for rule in RULES {
        violations
            .extend((rule.check)(&repo).with_context(|| format!("tidy rule `{}`", rule.name))?);
    }
    for v in &violations {
        println!("{v}");
    }
    let files = repo.read.borrow().len();
    if violations.is_empty() {
        println!("tidy: ok ({} rules, {files} files checked)", RULES.len());
        Ok(())
    } else {
        bail!(
            "tidy: {} violation(s) in {files} files checked",
            violations.len()
        )
    }
}

/// `path` relative to `root`, with `/` separators.
fn relative(root: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(root).unwrap_or(path);
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

/// 1-based line number of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset)
        .unwrap_or(text)
        .bytes()
        .filter(|&b| b == b'\n')
        .count()
        + 1
}

/// `(line, rule)` of each violation, for tests.
#[cfg(test)]
fn rules(violations: &[Violation]) -> Vec<(usize, &'static str)> {
    violations.iter().map(|v| (v.line, v.rule)).collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn violation_display_format() {
        let v = violation("crates/a/src/lib.rs", 3, lib_doc::NAME, "msg".to_string());
        assert_eq!(v.to_string(), "crates/a/src/lib.rs:3: lib-doc: msg");
    }

    #[test]
    fn relative_uses_forward_slashes() {
        let root = Path::new("/repo");
        assert_eq!(
            relative(root, &root.join("crates").join("a").join("Cargo.toml")),
            "crates/a/Cargo.toml"
        );
    }

    #[test]
    fn rule_names_are_unique() {
        let names: BTreeSet<&str> = RULES.iter().map(|rule| rule.name).collect();
        assert_eq!(names.len(), RULES.len());
    }

    #[test]
    fn line_numbers_count_from_one() {
        assert_eq!(line_of("a\nb\nc", 2), 2);
        assert_eq!(line_of("a", 0), 1);
    }
}
