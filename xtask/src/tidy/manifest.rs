//! Dependency declarations read from a `Cargo.toml`, with their lines.

use anyhow::Result;
use toml::de::{DeTable, DeValue};

use super::line_of;

const DEPENDENCY_TABLES: &[&str] = &[
    "dependencies",
    "dev-dependencies",
    "build-dependencies",
    "dev_dependencies",
    "build_dependencies",
];

/// One dependency declaration in a manifest, in any TOML form: `name = "1"`,
/// `name = { .. }`, `name.key = ..`, or a `[..dependencies.name]` table.
#[derive(Debug)]
pub struct Dependency {
    /// The dependency table, e.g. `dependencies`, `workspace.dependencies` or
    /// `target.cfg(unix).dev-dependencies`.
    pub table: String,
    /// The kind of table: one of [`DEPENDENCY_TABLES`].
    pub kind: String,
    pub name: String,
    /// Line of the first mention of `name`.
    pub line: usize,
    /// The `version`, or the whole value when it is a bare string.
    pub version: Option<String>,
    /// The `package` a renamed dependency stands for.
    pub package: Option<String>,
    /// `workspace = true`.
    pub workspace: bool,
}

impl Dependency {
    pub fn package_name(&self) -> &str {
        self.package.as_deref().unwrap_or(&self.name)
    }

    pub fn is_bincode(&self) -> bool {
        self.package_name() == "bincode"
    }

    pub fn is_normal(&self) -> bool {
        self.kind == "dependencies" && self.table != "workspace.dependencies"
    }
}

/// Dependency declarations of a manifest, in order of first mention: the tables
/// `[<kind>]`, `[target.<cfg>.<kind>]` (for each kind in [`DEPENDENCY_TABLES`]) and
/// `[workspace.dependencies]`.
pub fn dependencies(manifest: &str) -> Result<Vec<Dependency>> {
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
/// The line of `manifest` declaring a normal dependency on package `package`.
pub fn dependency_line(manifest: &str, package: &str) -> Option<usize> {
    dependencies(manifest)
        .ok()?
        .into_iter()
        .find(|dep| dep.is_normal() && dep.package_name() == package)
        .map(|dep| dep.line)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
