//! `cargo xtask tidy`: repository rules that rustc and clippy do not check.
//!
//! Every rule is a pure function from a repository-relative path (with `/` separators)
//! and the file's contents to the violations found, so each can be unit-tested.
//! [`run`] walks the repository, applies them, and prints `path:line: rule: message`.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

pub const RULE_ACTIX_TOKIO: &str = "no-actix-tokio-in-core";
pub const RULE_BINCODE: &str = "bincode-pinned";
pub const RULE_UNWRAP: &str = "no-unwrap-in-lib";
pub const RULE_DBG: &str = "no-dbg";
pub const RULE_LIB_DOC: &str = "lib-doc";

/// The exact version requirement bincode must be pinned to.
pub const BINCODE_PIN: &str = "=2.0.1";

/// Crates allowed to use actix/tokio anywhere.
const RUNTIME_CRATES: &[&str] = &["kvtier", "kvtier-cli"];
/// Directory names or file stems under `src/` where actor shells may use actix/tokio.
const SHELL_MODULES: &[&str] = &["actor", "actors", "shell", "runtime"];
const ACTIX_TOKIO_PATTERNS: &[&str] = &[
    "actix::",
    "tokio::",
    "use actix",
    "use tokio",
    "extern crate actix",
    "extern crate tokio",
];
const DEPENDENCY_TABLES: &[&str] = &[
    "dependencies",
    "dev-dependencies",
    "build-dependencies",
    "dev_dependencies",
    "build_dependencies",
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

// ---------------------------------------------------------------------------------------
// Driver
// ---------------------------------------------------------------------------------------

/// Runs every rule over the repository at `root`; an error if anything is violated.
pub fn run(root: &Path) -> Result<()> {
    let (violations, files) = check_repo(root)?;
    for v in &violations {
        println!("{v}");
    }
    if violations.is_empty() {
        println!("tidy: ok ({files} files checked)");
        Ok(())
    } else {
        bail!(
            "tidy: {} violation(s) in {files} files checked",
            violations.len()
        )
    }
}

/// All violations in the repository, and how many files were checked.
fn check_repo(root: &Path) -> Result<(Vec<Violation>, usize)> {
    let mut violations = Vec::new();
    let mut files = 0;

    let crate_dirs = crate_dirs(root)?;

    // Manifests: the root, every crate, and xtask.
    let root_manifest = read(&root.join("Cargo.toml"))?;
    let root_pins = root_pins_bincode_exactly(&root_manifest);
    let mut manifests: Vec<PathBuf> = vec![root.join("Cargo.toml")];
    manifests.extend(crate_dirs.iter().map(|dir| dir.join("Cargo.toml")));
    let xtask_manifest = root.join("xtask").join("Cargo.toml");
    if xtask_manifest.is_file() {
        manifests.push(xtask_manifest);
    }
    for manifest in &manifests {
        let contents = read(manifest)?;
        violations.extend(check_bincode(
            &relative(root, manifest),
            &contents,
            root_pins,
        ));
        files += 1;
    }

    // Sources under crates/*/src.
    for dir in &crate_dirs {
        let manifest = read(&dir.join("Cargo.toml"))?;
        let dir_name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let crate_name = package_name(&manifest).unwrap_or(dir_name);
        let src = dir.join("src");
        if !src.is_dir() {
            continue;
        }
        for file in rust_files(&src)? {
            let path = relative(root, &file);
            let contents = read(&file)?;
            violations.extend(check_actix_tokio(&crate_name, &path, &contents));
            violations.extend(check_unwrap(&path, &contents));
            violations.extend(check_dbg(&path, &contents));
            violations.extend(check_lib_doc(&path, &contents));
            files += 1;
        }
    }
    Ok((violations, files))
}

/// `crates/*` directories that hold a `Cargo.toml`, sorted.
fn crate_dirs(root: &Path) -> Result<Vec<PathBuf>> {
    let crates = root.join("crates");
    if !crates.is_dir() {
        return Ok(Vec::new());
    }
    let mut dirs = Vec::new();
    for entry in fs::read_dir(&crates).with_context(|| format!("reading {}", crates.display()))? {
        let path = entry?.path();
        if path.join("Cargo.toml").is_file() {
            dirs.push(path);
        }
    }
    dirs.sort();
    Ok(dirs)
}

/// Every `.rs` file under `dir`, recursively, sorted.
fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// `path` relative to `root`, with `/` separators.
fn relative(root: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(root).unwrap_or(path);
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

// ---------------------------------------------------------------------------------------
// Source rules
// ---------------------------------------------------------------------------------------

/// The part of a `crates/<crate>/src/...` path below `src/` (the whole path if it has none).
fn src_relative(path: &str) -> &str {
    let parts: Vec<&str> = path.split('/').collect();
    let src_index = if parts.len() > 3 && parts[0] == "crates" && parts[2] == "src" {
        Some(2)
    } else {
        parts.iter().position(|&p| p == "src")
    };
    match src_index {
        Some(index) => {
            let offset: usize = parts[..=index].iter().map(|p| p.len() + 1).sum();
            &path[offset.min(path.len())..]
        }
        None => path,
    }
}

/// Directory components of `path` (everything but the file name).
fn dir_components(path: &str) -> impl Iterator<Item = &str> {
    let dirs = path.rsplit_once('/').map_or("", |(dirs, _)| dirs);
    dirs.split('/').filter(|c| !c.is_empty())
}

fn file_stem(path: &str) -> &str {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.split_once('.').map_or(name, |(stem, _)| stem)
}

/// Whether actix/tokio may be used in `path`: an actor shell module below `src/`.
pub fn is_shell_path(path: &str) -> bool {
    let rel = src_relative(path);
    dir_components(rel)
        .chain([file_stem(rel)])
        .any(|c| SHELL_MODULES.contains(&c))
}

/// No actix or tokio in core crates, except in actor/shell/runtime modules.
pub fn check_actix_tokio(crate_name: &str, path: &str, contents: &str) -> Vec<Violation> {
    if RUNTIME_CRATES.contains(&crate_name) || is_shell_path(path) {
        return Vec::new();
    }
    contents
        .lines()
        .enumerate()
        .filter_map(|(index, line)| {
            let pattern = ACTIX_TOKIO_PATTERNS.iter().find(|p| line.contains(*p))?;
            Some(violation(
                path,
                index + 1,
                RULE_ACTIX_TOKIO,
                format!(
                    "`{pattern}` in core crate `{crate_name}`; actix/tokio belong in an \
                     actor/actors/shell/runtime module"
                ),
            ))
        })
        .collect()
}

/// Whether `path` is library code for the unwrap rule: not `src/main.rs`, not `src/bin/**`,
/// and not under a `tests`, `benches` or `examples` directory.
pub fn is_library_source(path: &str) -> bool {
    let rel = src_relative(path);
    if rel == "main.rs" || rel.starts_with("bin/") {
        return false;
    }
    !dir_components(path).any(|c| matches!(c, "tests" | "benches" | "examples"))
}

/// No `.unwrap()` in library code, outside the trailing `#[cfg(test)]` part and comments.
pub fn check_unwrap(path: &str, contents: &str) -> Vec<Violation> {
    if !is_library_source(path) {
        return Vec::new();
    }
    contents
        .lines()
        .enumerate()
        .take_while(|(_, line)| !line.trim().starts_with("#[cfg(test)]"))
        .filter(|(_, line)| !line.trim().starts_with("//"))
        .filter_map(|(index, line)| {
            let count = line.matches(".unwrap()").count();
            (count > 0).then(|| {
                let times = if count > 1 {
                    format!(" ({count} times)")
                } else {
                    String::new()
                };
                violation(
                    path,
                    index + 1,
                    RULE_UNWRAP,
                    format!(
                        "`.unwrap()` in library code{times}; return an error or use `expect` \
                         with the invariant"
                    ),
                )
            })
        })
        .collect()
}

/// No `dbg!(` anywhere.
pub fn check_dbg(path: &str, contents: &str) -> Vec<Violation> {
    contents
        .lines()
        .enumerate()
        .filter(|(_, line)| line.contains("dbg!("))
        .map(|(index, _)| {
            violation(
                path,
                index + 1,
                RULE_DBG,
                "`dbg!(` left in the source".to_string(),
            )
        })
        .collect()
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
            RULE_LIB_DOC,
            "lib.rs must start with a `//!` module doc comment".to_string(),
        )],
        None => vec![violation(
            path,
            1,
            RULE_LIB_DOC,
            "lib.rs is empty; it must start with a `//!` module doc comment".to_string(),
        )],
    }
}

// ---------------------------------------------------------------------------------------
// Manifest rule: bincode pinned exactly
// ---------------------------------------------------------------------------------------

/// One dependency declaration in a manifest, gathered from any of the TOML forms:
/// `name = "1"`, `name = { .. }`, `name.key = ..`, or a `[..dependencies.name]` table.
#[derive(Debug)]
struct Dependency {
    /// The dependency table, e.g. `dependencies` or `workspace.dependencies`.
    table: String,
    name: String,
    /// Line of the first mention.
    line: usize,
    /// Raw key/value pairs; a bare version string is stored as `version`.
    fields: Vec<(String, String)>,
}

impl Dependency {
    fn field(&self, key: &str) -> Option<String> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| unquote(v).to_string())
    }

    fn is_bincode(&self) -> bool {
        match self.field("package") {
            Some(package) => package == "bincode",
            None => self.name == "bincode",
        }
    }
}

/// Whether the root manifest pins bincode exactly in `[workspace.dependencies]`.
pub fn root_pins_bincode_exactly(root_manifest: &str) -> bool {
    dependencies(root_manifest).iter().any(|dep| {
        dep.table == "workspace.dependencies"
            && dep.is_bincode()
            && dep.field("version").as_deref() == Some(BINCODE_PIN)
    })
}

/// bincode, wherever it is a dependency, is pinned exactly to [`BINCODE_PIN`]
/// (directly, or through `workspace = true` when `root_pins_exactly`).
pub fn check_bincode(path: &str, manifest: &str, root_pins_exactly: bool) -> Vec<Violation> {
    let mut violations = Vec::new();
    for dep in dependencies(manifest).iter().filter(|dep| dep.is_bincode()) {
        let inherited = dep.field("workspace").as_deref() == Some("true");
        let problem = match dep.field("version") {
            Some(version) if version == BINCODE_PIN => None,
            Some(version) => Some(format!(
                "bincode in [{}] must be pinned exactly \"{BINCODE_PIN}\", found \"{version}\"",
                dep.table
            )),
            None if inherited && root_pins_exactly => None,
            None if inherited => Some(format!(
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
            violations.push(violation(path, dep.line, RULE_BINCODE, message));
        }
    }
    violations
}

/// Dependency declarations of a manifest, in order of first mention.
fn dependencies(manifest: &str) -> Vec<Dependency> {
    let mut deps: Vec<Dependency> = Vec::new();
    // The current `[header]`, split on dots.
    let mut header: Vec<String> = Vec::new();

    for (index, raw) in manifest.lines().enumerate() {
        let line_no = index + 1;
        let line = strip_comment(raw).trim();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('[') {
            let name = line.trim_start_matches('[').trim_end_matches(']');
            header = split_outside_quotes(name, '.')
                .iter()
                .map(|s| unquote(s).to_string())
                .collect();
            // `[dependencies.bincode]`: a table for one dependency.
            if let [table @ .., kind, name] = header.as_slice()
                && DEPENDENCY_TABLES.contains(&kind.as_str())
            {
                let table = join_table(table, kind);
                entry(&mut deps, &table, name, line_no);
            }
            continue;
        }
        let Some((key, value)) = split_key_value(line) else {
            continue;
        };
        let key: Vec<String> = split_outside_quotes(key, '.')
            .iter()
            .map(|s| unquote(s).to_string())
            .collect();
        let value = value.to_string();
        match header.as_slice() {
            // Inside `[..dependencies.name]`: a field of that dependency.
            [table @ .., kind, name] if DEPENDENCY_TABLES.contains(&kind.as_str()) => {
                let table = join_table(table, kind);
                entry(&mut deps, &table, name, line_no)
                    .fields
                    .push((key.join("."), value));
            }
            // Inside `[..dependencies]`: `name = ..` or `name.field = ..`.
            [table @ .., kind] if DEPENDENCY_TABLES.contains(&kind.as_str()) => {
                let table = join_table(table, kind);
                let Some((name, field)) = key.split_first() else {
                    continue;
                };
                let dep = entry(&mut deps, &table, name, line_no);
                if !field.is_empty() {
                    dep.fields.push((field.join("."), value));
                } else if value.starts_with('{') {
                    dep.fields.extend(parse_inline_table(&value));
                } else {
                    dep.fields.push(("version".to_string(), value));
                }
            }
            _ => {}
        }
    }
    deps
}

/// The declaration of `name` in `table`, added at `line` if not yet seen.
fn entry<'a>(
    deps: &'a mut Vec<Dependency>,
    table: &str,
    name: &str,
    line: usize,
) -> &'a mut Dependency {
    let index = match deps.iter().position(|d| d.table == table && d.name == name) {
        Some(index) => index,
        None => {
            deps.push(Dependency {
                table: table.to_string(),
                name: name.to_string(),
                line,
                fields: Vec::new(),
            });
            deps.len() - 1
        }
    };
    &mut deps[index]
}

fn join_table(prefix: &[String], kind: &str) -> String {
    let mut parts: Vec<&str> = prefix.iter().map(String::as_str).collect();
    parts.push(kind);
    parts.join(".")
}

/// `key = value` split at the first `=` outside quotes.
fn split_key_value(line: &str) -> Option<(&str, &str)> {
    let at = find_outside_quotes(line, '=')?;
    Some((line[..at].trim(), line[at + 1..].trim()))
}

/// Key/value pairs of a one-line TOML inline table `{ a = 1, b = "x" }`.
fn parse_inline_table(value: &str) -> Vec<(String, String)> {
    let inner = value.trim().trim_start_matches('{').trim_end_matches('}');
    split_outside_quotes(inner, ',')
        .into_iter()
        .filter_map(|pair| split_key_value(pair.trim()))
        .map(|(k, v)| (unquote(k).to_string(), v.to_string()))
        .collect()
}

fn unquote(s: &str) -> &str {
    let s = s.trim();
    for quote in ['"', '\''] {
        if s.len() >= 2 && s.starts_with(quote) && s.ends_with(quote) {
            return &s[1..s.len() - 1];
        }
    }
    s
}

/// Drops a trailing `# comment` (outside quotes).
fn strip_comment(line: &str) -> &str {
    match find_outside_quotes(line, '#') {
        Some(at) => &line[..at],
        None => line,
    }
}

/// Byte index of the first `target` outside quotes and outside `[]`/`{}` nesting.
fn find_outside_quotes(s: &str, target: char) -> Option<usize> {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut depth = 0usize;
    for (index, c) in s.char_indices() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' && q == '"' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
            }
            None => match c {
                '"' | '\'' => quote = Some(c),
                '[' | '{' => depth += 1,
                ']' | '}' => depth = depth.saturating_sub(1),
                _ if c == target && depth == 0 => return Some(index),
                _ => {}
            },
        }
    }
    None
}

/// Splits on `sep` outside quotes and brackets.
fn split_outside_quotes(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut rest = s;
    while let Some(at) = find_outside_quotes(rest, sep) {
        parts.push(rest[..at].trim());
        rest = &rest[at + sep.len_utf8()..];
    }
    parts.push(rest.trim());
    parts.retain(|p| !p.is_empty());
    parts
}

/// The `name` in a manifest's `[package]` table.
fn package_name(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for raw in manifest.lines() {
        let line = strip_comment(raw).trim();
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package
            && let Some((key, value)) = split_key_value(line)
            && key == "name"
        {
            return Some(unquote(value).to_string());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(violations: &[Violation]) -> Vec<(usize, &'static str)> {
        violations.iter().map(|v| (v.line, v.rule)).collect()
    }

    // --- actix / tokio ---

    #[test]
    fn tokio_in_core_module_is_flagged() {
        let src = "//! doc\nuse tokio::sync::mpsc;\nfn f() { tokio::spawn(async {}); }\n";
        let v = check_actix_tokio("kvtier-host", "crates/kvtier-host/src/lib.rs", src);
        assert_eq!(
            rules(&v),
            vec![(2, RULE_ACTIX_TOKIO), (3, RULE_ACTIX_TOKIO)]
        );
        assert_eq!(v[0].path, "crates/kvtier-host/src/lib.rs");
    }

    #[test]
    fn actix_forms_are_flagged() {
        for line in [
            "use actix::prelude::*;",
            "extern crate actix;",
            "use actix_rt::System;",
            "impl actix::Actor for X {}",
        ] {
            let v = check_actix_tokio("kvtier-fsm", "crates/kvtier-fsm/src/step.rs", line);
            assert_eq!(v.len(), 1, "{line}");
        }
        let v = check_actix_tokio(
            "kvtier-fsm",
            "crates/kvtier-fsm/src/step.rs",
            "extern crate tokio;",
        );
        assert_eq!(v.len(), 1);
    }

    #[test]
    fn shell_modules_may_use_tokio() {
        let src = "use tokio::sync::mpsc;\nuse actix::Actor;\n";
        for path in [
            "crates/kvtier-host/src/actor.rs",
            "crates/kvtier-host/src/actors.rs",
            "crates/kvtier-host/src/shell.rs",
            "crates/kvtier-host/src/runtime.rs",
            "crates/kvtier-host/src/actor/mod.rs",
            "crates/kvtier-host/src/actors/engine.rs",
            "crates/kvtier-host/src/shell/io/net.rs",
            "crates/kvtier-host/src/runtime/mod.rs",
        ] {
            assert!(
                check_actix_tokio("kvtier-host", path, src).is_empty(),
                "{path}"
            );
        }
    }

    #[test]
    fn shell_lookalikes_are_not_exempt() {
        let src = "use tokio::sync::mpsc;\n";
        for path in [
            "crates/kvtier-host/src/actor_state.rs",
            "crates/kvtier-host/src/shells/x.rs",
            "crates/kvtier-shell/src/lib.rs",
            "crates/kvtier-host/src/my_runtime/mod.rs",
        ] {
            assert_eq!(
                check_actix_tokio("kvtier-host", path, src).len(),
                1,
                "{path}"
            );
        }
    }

    #[test]
    fn facade_and_cli_may_use_tokio() {
        let src = "use tokio::runtime::Runtime;\n";
        assert!(check_actix_tokio("kvtier", "crates/kvtier/src/lib.rs", src).is_empty());
        assert!(check_actix_tokio("kvtier-cli", "crates/kvtier-cli/src/main.rs", src).is_empty());
    }

    #[test]
    fn unrelated_code_passes() {
        let src = "//! doc\nuse std::sync::mpsc;\nuse flume::Sender;\nfn tokio_like() {}\n";
        assert!(check_actix_tokio("kvtier-host", "crates/kvtier-host/src/lib.rs", src).is_empty());
    }

    // --- unwrap ---

    #[test]
    fn unwrap_in_library_code_is_flagged() {
        let src =
            "fn f(x: Option<u8>) -> u8 {\n    x.unwrap()\n}\nfn g() { a.unwrap(); b.unwrap(); }\n";
        let v = check_unwrap("crates/kvtier-radix/src/tree.rs", src);
        assert_eq!(rules(&v), vec![(2, RULE_UNWRAP), (4, RULE_UNWRAP)]);
        assert!(v[1].message.contains("2 times"));
    }

    #[test]
    fn unwrap_in_tests_and_comments_is_allowed() {
        let src = "\
/// Example: `x.unwrap()`
// x.unwrap()
fn f(x: Option<u8>) -> u8 { x.unwrap_or(0) }
fn g(x: Option<u8>) -> u8 { x.unwrap_or_default() }
#[cfg(test)]
mod tests {
    #[test]
    fn t() { Some(1).unwrap(); }
}
";
        assert!(check_unwrap("crates/kvtier-radix/src/lib.rs", src).is_empty());
    }

    #[test]
    fn code_after_cfg_test_is_ignored_even_if_not_a_test() {
        let src = "fn a() { x.unwrap(); }\n  #[cfg(test)]\nfn b() { y.unwrap(); }\n";
        assert_eq!(
            rules(&check_unwrap("crates/k/src/a.rs", src)),
            vec![(1, RULE_UNWRAP)]
        );
    }

    #[test]
    fn unwrap_outside_library_code_is_allowed() {
        let src = "fn main() { x.unwrap(); }\n";
        for path in [
            "crates/kvtier-cli/src/main.rs",
            "crates/kvtier-cli/src/bin/tool.rs",
            "crates/kvtier-cli/src/bin/tool/mod.rs",
            "crates/kvtier-sim/src/tests/helpers.rs",
            "crates/kvtier-sim/src/benches/b.rs",
            "crates/kvtier-sim/src/examples/e.rs",
            "crates/kvtier-sim/tests/it.rs",
        ] {
            assert!(check_unwrap(path, src).is_empty(), "{path}");
        }
        // A nested main.rs is library code.
        assert_eq!(
            check_unwrap("crates/kvtier-sim/src/cmd/main.rs", src).len(),
            1
        );
    }

    // --- dbg ---

    #[test]
    fn dbg_is_flagged_anywhere() {
        let src = "fn main() {\n    dbg!(1);\n}\n#[cfg(test)]\nmod tests { fn t() { dbg!(2); } }\n";
        let v = check_dbg("crates/kvtier-cli/src/main.rs", src);
        assert_eq!(rules(&v), vec![(2, RULE_DBG), (5, RULE_DBG)]);
        assert!(check_dbg("crates/k/src/lib.rs", "fn debug() { println!(\"dbg\"); }").is_empty());
    }

    // --- lib doc ---

    #[test]
    fn lib_doc_required() {
        let path = "crates/kvtier-fsm/src/lib.rs";
        assert!(check_lib_doc(path, "//! The state machine.\nmod a;\n").is_empty());
        assert!(check_lib_doc(path, "\n\n//! Doc after blank lines.\n").is_empty());
        assert_eq!(
            rules(&check_lib_doc(path, "mod a;\n")),
            vec![(1, RULE_LIB_DOC)]
        );
        assert_eq!(
            rules(&check_lib_doc(path, "\n/// outer doc\nmod a;\n")),
            vec![(2, RULE_LIB_DOC)]
        );
        assert_eq!(
            rules(&check_lib_doc(path, "#![deny(x)]\n//! late\n")),
            vec![(1, RULE_LIB_DOC)]
        );
        assert_eq!(rules(&check_lib_doc(path, "")), vec![(1, RULE_LIB_DOC)]);
        // Only lib.rs is checked.
        assert!(check_lib_doc("crates/kvtier-fsm/src/state.rs", "mod a;\n").is_empty());
        assert!(check_lib_doc("crates/kvtier-cli/src/main.rs", "fn main() {}\n").is_empty());
    }

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
        assert!(root_pins_bincode_exactly(ROOT_PINNED));
        assert!(root_pins_bincode_exactly(
            "[workspace.dependencies]\nbincode = \"=2.0.1\"\n"
        ));
        assert!(root_pins_bincode_exactly(
            "[workspace.dependencies.bincode]\nversion = \"=2.0.1\"\nfeatures = [\n  \"serde\",\n]\n"
        ));
        assert!(!root_pins_bincode_exactly(
            "[workspace.dependencies]\nbincode = \"2.0.1\"\n"
        ));
        assert!(!root_pins_bincode_exactly(
            "[workspace.dependencies]\nserde = \"1\"\n"
        ));
        // A pin in a member-style table is not a workspace pin.
        assert!(!root_pins_bincode_exactly(
            "[dependencies]\nbincode = \"=2.0.1\"\n"
        ));
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
                check_bincode("Cargo.toml", manifest, false).is_empty(),
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
            let v = check_bincode("crates/a/Cargo.toml", manifest, true);
            assert_eq!(rules(&v), vec![(line, RULE_BINCODE)], "{manifest}");
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
                check_bincode("crates/a/Cargo.toml", manifest, true).is_empty(),
                "{manifest}"
            );
            let v = check_bincode("crates/a/Cargo.toml", manifest, false);
            assert_eq!(v.len(), 1, "{manifest}");
            assert!(v[0].message.contains("inherited"));
        }
    }

    // --- helpers ---

    #[test]
    fn package_name_is_read_from_package_table() {
        let manifest = "[package]\nname = \"kvtier-cli\" # the cli\nversion = \"0.1.0\"\n[dependencies]\nname = \"x\"\n";
        assert_eq!(package_name(manifest).as_deref(), Some("kvtier-cli"));
        assert_eq!(package_name("[workspace]\nmembers = []\n"), None);
    }

    #[test]
    fn violation_display_format() {
        let v = violation("crates/a/src/lib.rs", 3, RULE_DBG, "msg".to_string());
        assert_eq!(v.to_string(), "crates/a/src/lib.rs:3: no-dbg: msg");
    }

    #[test]
    fn src_relative_paths() {
        assert_eq!(src_relative("crates/a/src/x/y.rs"), "x/y.rs");
        assert_eq!(src_relative("crates/a/src/main.rs"), "main.rs");
        assert_eq!(src_relative("src/bin/t.rs"), "bin/t.rs");
        assert_eq!(src_relative("lib.rs"), "lib.rs");
    }

    #[test]
    fn relative_uses_forward_slashes() {
        let root = Path::new("/repo");
        assert_eq!(
            relative(root, &root.join("crates").join("a").join("Cargo.toml")),
            "crates/a/Cargo.toml"
        );
    }
}
