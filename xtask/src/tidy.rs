//! `cargo xtask tidy`: repository rules that rustc and clippy do not check.
//!
//! Every rule is a pure function of its input (a parsed `cargo metadata` document, or a
//! repository-relative path with `/` separators and the file's contents) to the
//! violations found, so each can be unit-tested. [`run`] runs `cargo metadata`, reads
//! the files, applies the rules, and prints `path:line: rule: message`.
//!
//! Rules that clippy enforces live in `[workspace.lints.clippy]` of the root
//! `Cargo.toml` instead (`dbg_macro`, `unwrap_used`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use toml::de::{DeTable, DeValue};

use crate::{capture_stdout, cargo};

pub const RULE_ACTIX_TOKIO: &str = "no-actix-tokio-in-core";
pub const RULE_BINCODE: &str = "bincode-pinned";
pub const RULE_LIB_DOC: &str = "lib-doc";
pub const RULE_INVENTORY: &str = "inventory-names-a-test";

/// The exact version requirement bincode must be pinned to.
pub const BINCODE_PIN: &str = "=2.0.1";

/// The async runtime packages that core crates must not depend on.
const RUNTIME_PACKAGES: &[&str] = &["actix", "tokio"];

/// The workspace members that may depend on actix/tokio. Every other member is a core
/// crate: it must not depend on them, directly or through other crates.
const RUNTIME_CRATES: &[&str] = &[
    // The embedding API: the System builder, the handles and the actix runtime.
    "kvtier",
    // The command-line tool.
    "kvtier-cli",
    // The Python binding: it hosts the actor system behind `kvtier.System`.
    "kvtier-py",
    // Workloads and scenarios run through every path, the actix actors included, so it
    // depends on `kvtier`.
    "kvtier-sim",
    // Repository tooling.
    "xtask",
    // Top-level example and integration-test crates, should the workspace get them.
    "kvtier-examples",
    "kvtier-tests",
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
    let json =
        capture_stdout(cargo(root).args(["metadata", "--format-version", "1", "--all-features"]))?;
    let metadata = parse_metadata(&json)?;
    let workspace_root = metadata.workspace_root.clone();

    let mut violations = Vec::new();
    let mut files = 0;

    // Manifests: the root and every workspace member.
    let root_manifest_path = workspace_root.join("Cargo.toml");
    let root_manifest = read(&root_manifest_path)?;
    let root_pins = root_pins_bincode_exactly(&root_manifest)
        .with_context(|| format!("parsing {}", root_manifest_path.display()))?;
    let mut manifests = vec![root_manifest_path];
    for manifest in metadata.member_manifests()? {
        if !manifests.contains(&manifest) {
            manifests.push(manifest);
        }
    }
    for manifest in &manifests {
        let contents = read(manifest)?;
        let path = relative(&workspace_root, manifest);
        violations.extend(
            check_bincode(&path, &contents, root_pins)
                .with_context(|| format!("parsing {}", manifest.display()))?,
        );
        files += 1;
    }

    // Resolved dependencies of the core crates.
    for dep in core_runtime_dependencies(&metadata)? {
        let manifest = fs::read_to_string(&dep.manifest).ok();
        let path = relative(&workspace_root, &dep.manifest);
        violations.push(runtime_violation(&dep, &path, manifest.as_deref()));
    }

    // Every member's src/lib.rs.
    for manifest in metadata.member_manifests()? {
        let Some(dir) = manifest.parent() else {
            continue;
        };
        let lib = dir.join("src").join("lib.rs");
        if lib.is_file() {
            let contents = read(&lib)?;
            violations.extend(check_lib_doc(&relative(&workspace_root, &lib), &contents));
            files += 1;
        }
    }

    // Test inventories: every `file::test` they name exists.
    let inventories = workspace_root.join("docs").join("test-inventory");
    let mut functions_of: HashMap<String, HashSet<String>> = HashMap::new();
    for manifest in metadata.member_manifests()? {
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
                let contents = read(&path)?;
                functions_of
                    .entry(stem.to_string())
                    .or_default()
                    .extend(function_names(&contents));
            }
        }
    }
    let mut inventory_files: Vec<PathBuf> = fs::read_dir(&inventories)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    inventory_files.sort();
    for inventory in inventory_files {
        if inventory.extension().is_some_and(|e| e == "md") {
            let contents = read(&inventory)?;
            let path = relative(&workspace_root, &inventory);
            violations.extend(check_inventory(&path, &contents, &functions_of));
            files += 1;
        }
    }
    Ok((violations, files))
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
                    RULE_INVENTORY,
                    format!("`{module}::{test}` names no function of a `{module}.rs` test file"),
                ));
            }
        }
    }
    violations
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

/// 1-based line number of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset)
        .unwrap_or(text)
        .bytes()
        .filter(|&b| b == b'\n')
        .count()
        + 1
}

// ---------------------------------------------------------------------------------------
// Metadata rule: no actix or tokio in core crates
// ---------------------------------------------------------------------------------------

/// The parts of `cargo metadata --format-version 1` output the rules read.
#[derive(Debug, Deserialize)]
pub struct Metadata {
    packages: Vec<Package>,
    workspace_members: Vec<String>,
    /// Absent under `--no-deps`.
    resolve: Option<Resolve>,
    workspace_root: PathBuf,
}

#[derive(Debug, Deserialize)]
struct Package {
    id: String,
    name: String,
    manifest_path: PathBuf,
}

#[derive(Debug, Deserialize)]
struct Resolve {
    nodes: Vec<Node>,
}

#[derive(Debug, Deserialize)]
struct Node {
    id: String,
    #[serde(default)]
    deps: Vec<NodeDep>,
}

#[derive(Debug, Deserialize)]
struct NodeDep {
    pkg: String,
    #[serde(default)]
    dep_kinds: Vec<DepKind>,
}

#[derive(Debug, Deserialize)]
struct DepKind {
    /// `null` for a normal dependency, else `"dev"` or `"build"`.
    kind: Option<String>,
}

impl NodeDep {
    /// Whether this is a normal dependency (possibly also a dev or build one).
    fn is_normal(&self) -> bool {
        self.dep_kinds.is_empty() || self.dep_kinds.iter().any(|k| k.kind.is_none())
    }
}

impl Metadata {
    fn package(&self, id: &str) -> Option<&Package> {
        self.packages.iter().find(|p| p.id == id)
    }

    /// The workspace members' manifests, sorted.
    fn member_manifests(&self) -> Result<Vec<PathBuf>> {
        let mut manifests = self
            .workspace_members
            .iter()
            .map(|id| {
                self.package(id)
                    .map(|p| p.manifest_path.clone())
                    .with_context(|| format!("cargo metadata: workspace member `{id}` not listed"))
            })
            .collect::<Result<Vec<_>>>()?;
        manifests.sort();
        Ok(manifests)
    }
}

pub fn parse_metadata(json: &str) -> Result<Metadata> {
    serde_json::from_str(json).context("parsing `cargo metadata` output")
}

/// A core crate reaching a runtime package through normal dependencies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeDependency {
    /// The core crate's manifest.
    pub manifest: PathBuf,
    /// Package names from the core crate to the runtime package, both included:
    /// a shortest such path.
    pub chain: Vec<String>,
}

/// For every core crate (a workspace member not in [`RUNTIME_CRATES`]), each runtime
/// package ([`RUNTIME_PACKAGES`]) it depends on through normal (non-dev, non-build)
/// dependencies, directly or through other crates, workspace members or not.
pub fn core_runtime_dependencies(metadata: &Metadata) -> Result<Vec<RuntimeDependency>> {
    let Some(resolve) = &metadata.resolve else {
        bail!("cargo metadata: no `resolve` graph (was it run with --no-deps?)");
    };
    let names: HashMap<&str, &str> = metadata
        .packages
        .iter()
        .map(|p| (p.id.as_str(), p.name.as_str()))
        .collect();
    let name = |id: &str| names.get(id).copied().unwrap_or(id).to_string();
    let edges: HashMap<&str, Vec<&str>> = resolve
        .nodes
        .iter()
        .map(|node| {
            let deps = node
                .deps
                .iter()
                .filter(|dep| dep.is_normal())
                .map(|dep| dep.pkg.as_str())
                .collect();
            (node.id.as_str(), deps)
        })
        .collect();

    let mut members: Vec<&Package> = metadata
        .workspace_members
        .iter()
        .map(|id| {
            metadata
                .package(id)
                .with_context(|| format!("cargo metadata: workspace member `{id}` not listed"))
        })
        .collect::<Result<_>>()?;
    members.sort_by(|a, b| a.name.cmp(&b.name));

    let mut found = Vec::new();
    for member in members {
        if RUNTIME_CRATES.contains(&member.name.as_str()) {
            continue;
        }
        // Breadth-first from the member; a runtime package ends its path.
        let mut parent: HashMap<&str, &str> = HashMap::new();
        let mut seen: HashSet<&str> = HashSet::from([member.id.as_str()]);
        let mut queue = VecDeque::from([member.id.as_str()]);
        let mut reached = Vec::new();
        while let Some(id) = queue.pop_front() {
            for &dep in edges.get(id).into_iter().flatten() {
                if !seen.insert(dep) {
                    continue;
                }
                parent.insert(dep, id);
                if RUNTIME_PACKAGES.contains(&name(dep).as_str()) {
                    reached.push(dep);
                } else {
                    queue.push_back(dep);
                }
            }
        }
        let mut chains: Vec<Vec<String>> = reached
            .into_iter()
            .map(|target| {
                let mut chain = vec![name(target)];
                let mut at = target;
                while let Some(&up) = parent.get(at) {
                    chain.push(name(up));
                    at = up;
                }
                chain.reverse();
                chain
            })
            .collect();
        chains.sort_by(|a, b| (a.last(), a.len()).cmp(&(b.last(), b.len())));
        found.extend(chains.into_iter().map(|chain| RuntimeDependency {
            manifest: member.manifest_path.clone(),
            chain,
        }));
    }
    Ok(found)
}

/// The violation for `dep`, at the line of `manifest` (the core crate's `Cargo.toml`,
/// relative `path`) that declares the first dependency on the way, if it can be found.
fn runtime_violation(dep: &RuntimeDependency, path: &str, manifest: Option<&str>) -> Violation {
    let first_hop = dep.chain.get(1).map(String::as_str).unwrap_or_default();
    let line = manifest
        .and_then(|manifest| dependency_line(manifest, first_hop))
        .unwrap_or(1);
    let core = dep.chain.first().map(String::as_str).unwrap_or_default();
    let runtime = dep.chain.last().map(String::as_str).unwrap_or_default();
    let through = if dep.chain.len() > 2 {
        format!(" through {}", dep.chain.join(" -> "))
    } else {
        String::new()
    };
    violation(
        path,
        line,
        RULE_ACTIX_TOKIO,
        format!(
            "core crate `{core}` depends on `{runtime}`{through}; only {} may depend on \
             actix/tokio",
            RUNTIME_CRATES.join(", ")
        ),
    )
}

/// The line of `manifest` declaring a normal dependency on package `package`.
fn dependency_line(manifest: &str, package: &str) -> Option<usize> {
    dependencies(manifest)
        .ok()?
        .into_iter()
        .find(|dep| dep.is_normal() && dep.package_name() == package)
        .map(|dep| dep.line)
}

// ---------------------------------------------------------------------------------------
// Source rule: lib.rs documented
// ---------------------------------------------------------------------------------------

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

/// One dependency declaration in a manifest, in any TOML form: `name = "1"`,
/// `name = { .. }`, `name.key = ..`, or a `[..dependencies.name]` table.
#[derive(Debug)]
struct Dependency {
    /// The dependency table, e.g. `dependencies`, `workspace.dependencies` or
    /// `target.cfg(unix).dev-dependencies`.
    table: String,
    /// The kind of table: one of [`DEPENDENCY_TABLES`].
    kind: String,
    name: String,
    /// Line of the first mention of `name`.
    line: usize,
    /// The `version`, or the whole value when it is a bare string.
    version: Option<String>,
    /// The `package` a renamed dependency stands for.
    package: Option<String>,
    /// `workspace = true`.
    workspace: bool,
}

impl Dependency {
    fn package_name(&self) -> &str {
        self.package.as_deref().unwrap_or(&self.name)
    }

    fn is_bincode(&self) -> bool {
        self.package_name() == "bincode"
    }

    fn is_normal(&self) -> bool {
        self.kind == "dependencies" && self.table != "workspace.dependencies"
    }
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
            violations.push(violation(path, dep.line, RULE_BINCODE, message));
        }
    }
    Ok(violations)
}

/// Dependency declarations of a manifest, in order of first mention: the tables
/// `[<kind>]`, `[target.<cfg>.<kind>]` (for each kind in [`DEPENDENCY_TABLES`]) and
/// `[workspace.dependencies]`.
fn dependencies(manifest: &str) -> Result<Vec<Dependency>> {
    let document = DeTable::parse(manifest)?;
    let mut deps = Vec::new();
    for (key, value) in document.get_ref() {
        let key = key.get_ref().as_ref();
        if DEPENDENCY_TABLES.contains(&key) {
            collect_dependencies(&mut deps, manifest, key, key, value.get_ref());
        } else if key == "workspace" {
            for (kind, value) in tables(value.get_ref()) {
                if kind == "dependencies" {
                    let table = "workspace.dependencies";
                    collect_dependencies(&mut deps, manifest, table, kind, value);
                }
            }
        } else if key == "target" {
            for (cfg, value) in tables(value.get_ref()) {
                for (kind, value) in tables(value) {
                    if DEPENDENCY_TABLES.contains(&kind) {
                        let table = format!("target.{cfg}.{kind}");
                        collect_dependencies(&mut deps, manifest, &table, kind, value);
                    }
                }
            }
        }
    }
    deps.sort_by_key(|dep| dep.line);
    Ok(deps)
}

/// The entries of `value` if it is a table (none otherwise).
fn tables<'a, 'i>(value: &'a DeValue<'i>) -> impl Iterator<Item = (&'a str, &'a DeValue<'i>)> {
    value
        .as_table()
        .into_iter()
        .flatten()
        .map(|(key, value)| (key.get_ref().as_ref(), value.get_ref()))
}

/// The dependencies declared in `value`, the dependency table `table` of kind `kind`.
fn collect_dependencies(
    deps: &mut Vec<Dependency>,
    manifest: &str,
    table: &str,
    kind: &str,
    value: &DeValue<'_>,
) {
    let Some(entries) = value.as_table() else {
        return;
    };
    for (name, spec) in entries {
        let mut dep = Dependency {
            table: table.to_string(),
            kind: kind.to_string(),
            name: name.get_ref().to_string(),
            line: line_of(manifest, name.span().start),
            version: None,
            package: None,
            workspace: false,
        };
        match spec.get_ref() {
            DeValue::String(version) => dep.version = Some(version.to_string()),
            spec => {
                for (field, value) in tables(spec) {
                    match field {
                        "version" => dep.version = value.as_str().map(str::to_string),
                        "package" => dep.package = value.as_str().map(str::to_string),
                        "workspace" => dep.workspace = value.as_bool() == Some(true),
                        _ => {}
                    }
                }
            }
        }
        deps.push(dep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(violations: &[Violation]) -> Vec<(usize, &'static str)> {
        violations.iter().map(|v| (v.line, v.rule)).collect()
    }

    // --- actix / tokio (cargo metadata) ---

    /// A `cargo metadata --format-version 1` document for a workspace at `/repo`:
    /// `members` are `(name, [(dependency, kind)])` with kind `null`, `"dev"` or
    /// `"build"`; `externals` are registry packages with their (normal) dependencies.
    fn metadata_json(members: &[(&str, &[(&str, &str)])], externals: &[(&str, &[&str])]) -> String {
        let member_id = |name: &str| format!("path+file:///repo/crates/{name}#0.1.0");
        let external_id = |name: &str| {
            format!("registry+https://github.com/rust-lang/crates.io-index#{name}@1.0.0")
        };
        let id = |name: &str| {
            if members.iter().any(|(member, _)| *member == name) {
                member_id(name)
            } else {
                external_id(name)
            }
        };
        let mut packages = Vec::new();
        let mut nodes = Vec::new();
        for (name, deps) in members {
            packages.push(serde_json::json!({
                "name": name,
                "version": "0.1.0",
                "id": member_id(name),
                "source": null,
                "manifest_path": format!("/repo/crates/{name}/Cargo.toml"),
                "dependencies": [],
                "targets": [],
                "features": {},
            }));
            let deps: Vec<_> = deps
                .iter()
                .map(|(dep, kind)| {
                    let kind = if *kind == "null" {
                        serde_json::Value::Null
                    } else {
                        (*kind).into()
                    };
                    serde_json::json!({
                        "name": dep.replace('-', "_"),
                        "pkg": id(dep),
                        "dep_kinds": [{ "kind": kind, "target": null }],
                    })
                })
                .collect();
            nodes.push(serde_json::json!({ "id": member_id(name), "deps": deps, "dependencies": [], "features": [] }));
        }
        for (name, deps) in externals {
            packages.push(serde_json::json!({
                "name": name,
                "version": "1.0.0",
                "id": external_id(name),
                "source": "registry+https://github.com/rust-lang/crates.io-index",
                "manifest_path": format!("/home/u/.cargo/registry/src/index/{name}-1.0.0/Cargo.toml"),
            }));
            let deps: Vec<_> = deps
                .iter()
                .map(|dep| serde_json::json!({
                    "name": dep, "pkg": id(dep), "dep_kinds": [{ "kind": null, "target": null }],
                }))
                .collect();
            nodes.push(serde_json::json!({ "id": external_id(name), "deps": deps }));
        }
        serde_json::json!({
            "packages": packages,
            "workspace_members": members.iter().map(|(name, _)| member_id(name)).collect::<Vec<_>>(),
            "workspace_default_members": [],
            "resolve": { "nodes": nodes, "root": null },
            "target_directory": "/repo/target",
            "version": 1,
            "workspace_root": "/repo",
            "metadata": null,
        })
        .to_string()
    }

    fn chains(json: &str) -> Vec<String> {
        let metadata = parse_metadata(json).expect("valid metadata");
        core_runtime_dependencies(&metadata)
            .expect("resolve graph")
            .iter()
            .map(|dep| dep.chain.join(" -> "))
            .collect()
    }

    const N: &str = "null";

    #[test]
    fn core_crate_depending_on_tokio_through_a_member_is_flagged() {
        let json = metadata_json(
            &[
                ("kvtier-types", &[]),
                ("kvtier-host", &[("kvtier-types", N), ("kvtier-fsm", N)]),
                ("kvtier-fsm", &[("kvtier-types", N), ("tokio", N)]),
            ],
            &[("tokio", &[])],
        );
        assert_eq!(
            chains(&json),
            vec!["kvtier-fsm -> tokio", "kvtier-host -> kvtier-fsm -> tokio"]
        );
        let metadata = parse_metadata(&json).expect("valid metadata");
        let deps = core_runtime_dependencies(&metadata).expect("resolve graph");
        assert_eq!(
            deps[1].manifest,
            Path::new("/repo/crates/kvtier-host/Cargo.toml")
        );
        let v = runtime_violation(&deps[1], "crates/kvtier-host/Cargo.toml", None);
        assert_eq!(v.rule, RULE_ACTIX_TOKIO);
        assert!(
            v.message.contains(
                "`kvtier-host` depends on `tokio` through kvtier-host -> kvtier-fsm -> tokio"
            ),
            "{}",
            v.message
        );
    }

    #[test]
    fn runtime_crates_may_depend_on_actix_and_tokio() {
        let json = metadata_json(
            &[
                ("kvtier-types", &[]),
                ("kvtier", &[("kvtier-types", N), ("actix", N), ("tokio", N)]),
                ("kvtier-cli", &[("kvtier", N), ("tokio", N)]),
                ("kvtier-sim", &[("kvtier", N)]),
                ("xtask", &[("tokio", N)]),
                ("kvtier-examples", &[("kvtier", N)]),
                ("kvtier-tests", &[("actix", N)]),
            ],
            &[("actix", &["tokio"]), ("tokio", &[])],
        );
        assert!(chains(&json).is_empty());
    }

    #[test]
    fn core_crate_depending_on_a_runtime_crate_is_flagged() {
        let json = metadata_json(
            &[
                ("kvtier", &[("actix", N), ("tokio", N)]),
                ("kvtier-radix", &[("kvtier", N)]),
            ],
            &[("actix", &["tokio"]), ("tokio", &[])],
        );
        assert_eq!(
            chains(&json),
            vec![
                "kvtier-radix -> kvtier -> actix",
                "kvtier-radix -> kvtier -> tokio"
            ]
        );
    }

    #[test]
    fn runtime_reached_through_external_crates_is_flagged() {
        let json = metadata_json(
            &[("kvtier-l3", &[("http-client", N)])],
            &[
                ("http-client", &["actix-rt"]),
                ("actix-rt", &["tokio"]),
                ("tokio", &[]),
            ],
        );
        assert_eq!(
            chains(&json),
            vec!["kvtier-l3 -> http-client -> actix-rt -> tokio"]
        );
    }

    #[test]
    fn dev_and_build_dependencies_are_not_followed() {
        let json = metadata_json(
            &[
                ("kvtier-fsm", &[("tokio", "dev")]),
                ("kvtier-device", &[("builder", "build")]),
                ("kvtier-host", &[("kvtier-fsm", N)]),
            ],
            &[("tokio", &[]), ("builder", &["tokio"])],
        );
        assert!(chains(&json).is_empty());
    }

    #[test]
    fn metadata_without_resolve_is_an_error() {
        let json = r#"{"packages": [], "workspace_members": [], "resolve": null,
                       "workspace_root": "/repo"}"#;
        let metadata = parse_metadata(json).expect("valid metadata");
        assert!(core_runtime_dependencies(&metadata).is_err());
        assert!(parse_metadata("{\"packages\": 1}").is_err());
    }

    #[test]
    fn runtime_violation_points_at_the_first_dependency() {
        let dep = RuntimeDependency {
            manifest: PathBuf::from("/repo/crates/kvtier-sim/Cargo.toml"),
            chain: vec!["kvtier-sim".into(), "kvtier".into(), "tokio".into()],
        };
        let manifest = "[package]\nname = \"kvtier-sim\"\n\n[dev-dependencies]\nkvtier.workspace = true\n\n[dependencies]\nkvtier-types.workspace = true\nkvtier.workspace = true\n";
        let v = runtime_violation(&dep, "crates/kvtier-sim/Cargo.toml", Some(manifest));
        assert_eq!(
            (v.path.as_str(), v.line),
            ("crates/kvtier-sim/Cargo.toml", 9)
        );
        let direct = RuntimeDependency {
            manifest: dep.manifest.clone(),
            chain: vec!["kvtier-sim".into(), "tokio".into()],
        };
        let renamed = "[dependencies]\nrt = { package = \"tokio\", version = \"1\" }\n";
        let v = runtime_violation(&direct, "crates/kvtier-sim/Cargo.toml", Some(renamed));
        assert_eq!(v.line, 2);
        assert!(v.message.ends_with("depends on `tokio`; only kvtier, kvtier-cli, kvtier-py, kvtier-sim, xtask, kvtier-examples, kvtier-tests may depend on actix/tokio"), "{}", v.message);
        // Not found (or no manifest): line 1.
        assert_eq!(
            runtime_violation(&direct, "x", Some("[dependencies]\n")).line,
            1
        );
        assert_eq!(runtime_violation(&direct, "x", None).line, 1);
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

    #[test]
    fn dependency_tables_and_lines() {
        let manifest = "\
[package]
name = \"a\"
[dependencies]
serde = \"1\"
[target.'cfg(unix)'.build-dependencies.cc]
version = \"1\"
[workspace.dependencies]
rt = { package = \"tokio\", workspace = true }
[package.metadata.dependencies]
ignored = \"1\"
";
        let deps = dependencies(manifest).expect("valid TOML");
        let found: Vec<_> = deps
            .iter()
            .map(|d| (d.table.as_str(), d.package_name(), d.line, d.is_normal()))
            .collect();
        assert_eq!(
            found,
            vec![
                ("dependencies", "serde", 4, true),
                ("target.cfg(unix).build-dependencies", "cc", 5, false),
                ("workspace.dependencies", "tokio", 8, false),
            ]
        );
        assert!(deps[2].workspace);
        assert_eq!(deps[1].version.as_deref(), Some("1"));
        assert_eq!(line_of("a\nb\nc", 2), 2);
        assert_eq!(line_of("a", 0), 1);
    }

    // --- helpers ---

    #[test]
    fn violation_display_format() {
        let v = violation("crates/a/src/lib.rs", 3, RULE_LIB_DOC, "msg".to_string());
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
            vec![(2, RULE_INVENTORY), (2, RULE_INVENTORY)]
        );
    }
}
