//! Rule `inventory-names-a-test`: the test inventories in `docs/test-inventory/` name
//! only tests that exist, so a renamed or deleted test leaves no stale row behind.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::PathBuf;

use anyhow::Result;

use super::{Repo, Violation, violation};

pub const NAME: &str = "inventory-names-a-test";

/// Every inventory against the functions of every member's `tests/*.rs`.
pub fn check(repo: &Repo) -> Result<Vec<Violation>> {
    let mut functions_of: HashMap<String, HashSet<String>> = HashMap::new();
    for manifest in repo.metadata().member_manifests()? {
        let Some(tests) = manifest.parent().map(|dir| dir.join("tests")) else {
            continue;
        };
        let Ok(entries) = fs::read_dir(&tests) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if let (Some(stem), Some("rs")) = (
                path.file_stem().and_then(|s| s.to_str()),
                path.extension().and_then(|s| s.to_str()),
            ) {
                let contents = repo.read(&path)?;
                functions_of
                    .entry(stem.to_string())
                    .or_default()
                    .extend(function_names(&contents));
            }
        }
    }
    let inventories = repo.root().join("docs").join("test-inventory");
    let mut inventory_files: Vec<PathBuf> = fs::read_dir(&inventories)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    inventory_files.sort();
    let mut violations = Vec::new();
    for inventory in inventory_files {
        if inventory.extension().is_some_and(|e| e == "md") {
            let contents = repo.read(&inventory)?;
            violations.extend(check_inventory(
                &repo.relative(&inventory),
                &contents,
                &functions_of,
            ));
        }
    }
    Ok(violations)
}

/// The names of the functions a Rust file defines (`fn name`).
fn function_names(contents: &str) -> impl Iterator<Item = String> + '_ {
    contents.split("fn ").skip(1).filter_map(|rest| {
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        (!name.is_empty()).then_some(name)
    })
}

/// Every `` `file::test` `` (and `` `::test` `` after one, in the same cell) a test
/// inventory names must be a function of a test file of that name: a renamed or deleted
/// test leaves no stale row behind. Names of other kinds (types, crate paths) have an
/// upper-case letter or no test file of that name, and are not checked.
pub fn check_inventory(
    path: &str,
    contents: &str,
    functions_of: &HashMap<String, HashSet<String>>,
) -> Vec<Violation> {
    let mut violations = Vec::new();
    for (index, line) in contents.lines().enumerate() {
        let mut file: Option<&str> = None;
        for code in line.split('`').skip(1).step_by(2) {
            let Some((module, test)) = code.split_once("::") else {
                continue;
            };
            if !module.is_empty() {
                file = Some(module);
            }
            let Some(module) = file else {
                continue;
            };
            let Some(functions) = functions_of.get(module) else {
                continue;
            };
            let is_test_name = !test.is_empty()
                && test
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if is_test_name && !functions.contains(test) {
                violations.push(violation(
                    path,
                    index + 1,
                    NAME,
                    format!("`{module}::{test}` names no function of a `{module}.rs` test file"),
                ));
            }
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tidy::rules;

    #[test]
    fn inventories_name_only_tests_that_exist() {
        let functions_of: HashMap<String, HashSet<String>> = [(
            "abort".to_string(),
            function_names("fn helper() {}\n#[test]\nfn aborts_free_pages() {}\n").collect(),
        )]
        .into();
        let doc = "| `Abort_X` | `abort::aborts_free_pages`, `::helper` | |\n\
                   | `Abort_Y` | `abort::renamed_away`, `::gone_too` | |\n\
                   | types | `kvtier_types::engine_rule`, `abort::Scheduler` | |\n";
        assert_eq!(
            rules(&check_inventory("inv.md", doc, &functions_of)),
            vec![(2, NAME), (2, NAME)]
        );
    }
}
