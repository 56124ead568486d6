//! Rule `file-size`: a source file outside tests (`tests/` directories, `tests.rs` unit
//! test modules) stays within [`BUDGET`] lines, so a reader can hold it in mind. A file
//! over it names its reason on one line of [`ALLOWANCES`]; an allowance for a file that
//! no longer needs one is flagged too, so the list only shrinks with the files.

use std::collections::BTreeMap;

use anyhow::Result;

use super::{Repo, Violation, violation};

pub const NAME: &str = "file-size";

/// Lines a source file may have.
pub const BUDGET: usize = 700;

/// The allow-list: `path: reason` per line, `#` comments.
pub const ALLOWANCES: &str = "xtask/src/tidy/oversize.txt";

/// Every `.rs` file of every member, tests aside, against the allow-list.
pub fn check(repo: &Repo) -> Result<Vec<Violation>> {
    let mut sizes = Vec::new();
    for member in repo.metadata().members()? {
        let Some(dir) = member.manifest_path.parent() else {
            continue;
        };
        for path in repo.rust_files(dir) {
            let relative = repo.relative(&path);
            if !is_test(&relative) {
                sizes.push((relative, repo.read(&path)?.lines().count()));
            }
        }
    }
    let allowances = repo.read(&repo.root().join(ALLOWANCES))?;
    Ok(check_sizes(&sizes, &allowances))
}

/// Test code: a `tests/` directory (a crate's, or the end-to-end test crate), or a
/// module's unit tests in a `tests.rs` of their own.
fn is_test(relative: &str) -> bool {
    relative.split('/').any(|part| part == "tests") || relative.ends_with("/tests.rs")
}

/// `sizes` (path, lines) against the allow-list `allowances`.
pub fn check_sizes(sizes: &[(String, usize)], allowances: &str) -> Vec<Violation> {
    let mut violations = Vec::new();
    let mut allowed: BTreeMap<&str, usize> = BTreeMap::new();
    for (index, line) in allowances.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line.split_once(':') {
            Some((path, reason)) if !reason.trim().is_empty() => {
                allowed.insert(path.trim(), index + 1);
            }
            _ => violations.push(violation(
                ALLOWANCES,
                index + 1,
                NAME,
                format!("`{line}` gives no reason; write `path: why it is one file`"),
            )),
        }
    }
    let measured: BTreeMap<&str, usize> = sizes
        .iter()
        .map(|(path, lines)| (path.as_str(), *lines))
        .collect();
    for (&path, &lines) in &measured {
        if lines > BUDGET && !allowed.contains_key(path) {
            violations.push(violation(
                path,
                1,
                NAME,
                format!(
                    "{lines} lines, over the budget of {BUDGET}: split it by responsibility, or \
                     name the reason it is one file in {ALLOWANCES}"
                ),
            ));
        }
    }
    for (&path, &line) in &allowed {
        match measured.get(path) {
            Some(&lines) if lines > BUDGET => {}
            Some(&lines) => violations.push(violation(
                ALLOWANCES,
                line,
                NAME,
                format!("`{path}` has {lines} lines, within the budget: remove its allowance"),
            )),
            None => violations.push(violation(
                ALLOWANCES,
                line,
                NAME,
                format!("`{path}` is no source file outside tests: remove its allowance"),
            )),
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(files: &[(&str, usize)]) -> Vec<(String, usize)> {
        files.iter().map(|(p, n)| (p.to_string(), *n)).collect()
    }

    #[test]
    fn files_within_the_budget_or_allowed_pass() {
        let files = sizes(&[("a/src/lib.rs", BUDGET), ("a/src/big.rs", BUDGET + 1)]);
        let allow = "# why each is one file\n\na/src/big.rs: one table of opcodes\n";
        assert!(check_sizes(&files, allow).is_empty());
    }

    #[test]
    fn a_file_over_the_budget_without_a_reason_is_flagged() {
        let files = sizes(&[("a/src/big.rs", BUDGET + 1), ("b/src/big.rs", 900)]);
        let v = check_sizes(&files, "b/src/big.rs:\n");
        let found: Vec<(&str, usize)> = v.iter().map(|v| (v.path.as_str(), v.line)).collect();
        assert_eq!(
            found,
            vec![(ALLOWANCES, 1), ("a/src/big.rs", 1), ("b/src/big.rs", 1)]
        );
        assert!(
            v[1].message
                .starts_with("701 lines, over the budget of 700")
        );
    }

    #[test]
    fn stale_allowances_are_flagged() {
        let files = sizes(&[("a/src/small.rs", 10)]);
        let v = check_sizes(&files, "a/src/small.rs: was big\na/src/gone.rs: was big\n");
        let lines: Vec<usize> = v.iter().map(|v| v.line).collect();
        assert_eq!(lines, vec![2, 1]);
        assert!(v[0].message.contains("no source file"));
        assert!(v[1].message.contains("within the budget"));
    }

    #[test]
    fn test_directories_are_not_measured() {
        assert!(is_test("crates/kvtier-fsm/tests/step.rs"));
        assert!(is_test("tests/e2e/toy_actor.rs"));
        assert!(is_test("crates/kvtier-l3/src/local/tests.rs"));
        assert!(!is_test("crates/kvtier-fsm/src/step.rs"));
    }
}
