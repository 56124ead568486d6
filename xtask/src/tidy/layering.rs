//! Rule `crate-layering`: each workspace crate depends (normal dependencies) only on the
//! crates of ours that the layering table of `docs/architecture.md` allows it, so the
//! document and the manifests cannot drift apart. Dev-dependencies are free: a test may
//! use anything.

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use anyhow::Result;

use super::manifest::dependency_line;
use super::{Repo, Violation, violation};

pub const NAME: &str = "crate-layering";

/// Where the table lives, and the heading it follows.
pub const DOCUMENT: &str = "docs/architecture.md";
pub const HEADING: &str = "## Layering";

/// One workspace member as the rule sees it.
pub struct Member {
    pub name: String,
    /// Its manifest, relative to the repository, and the manifest's text.
    pub manifest_path: String,
    pub manifest: Rc<str>,
    /// The workspace members it depends on through normal dependencies.
    pub uses: BTreeSet<String>,
}

pub fn check(repo: &Repo) -> Result<Vec<Violation>> {
    let metadata = repo.metadata();
    let names = metadata.names();
    let edges = metadata.normal_edges()?;
    let members = metadata.members()?;
    let member_ids: BTreeSet<&str> = members.iter().map(|p| p.id.as_str()).collect();
    let mut seen = Vec::new();
    for package in &members {
        let uses = edges
            .get(package.id.as_str())
            .into_iter()
            .flatten()
            .filter(|dep| member_ids.contains(*dep))
            .filter_map(|dep| names.get(dep).map(|name| name.to_string()))
            .collect();
        seen.push(Member {
            name: package.name.clone(),
            manifest_path: repo.relative(&package.manifest_path),
            manifest: repo.read(&package.manifest_path)?,
            uses,
        });
    }
    let document = repo.read(&repo.root().join(DOCUMENT))?;
    Ok(check_layering(&document, &seen))
}

/// A crate's row of the table: the line it is on and the crates it may depend on.
type Table = BTreeMap<String, (usize, BTreeSet<String>)>;

/// The members against the table in `document`.
pub fn check_layering(document: &str, members: &[Member]) -> Vec<Violation> {
    let (heading_line, table) = match parse_table(document) {
        Ok(found) => found,
        Err(problem) => return vec![problem],
    };
    let mut violations = Vec::new();
    let known: BTreeSet<&str> = members.iter().map(|m| m.name.as_str()).collect();
    for (name, (line, allowed)) in &table {
        for stranger in std::iter::once(name).chain(allowed) {
            if !known.contains(stranger.as_str()) {
                violations.push(violation(
                    DOCUMENT,
                    *line,
                    NAME,
                    format!("the layering table names `{stranger}`, which is no workspace member"),
                ));
            }
        }
    }
    for member in members {
        let Some((_, allowed)) = table.get(&member.name) else {
            violations.push(violation(
                DOCUMENT,
                heading_line,
                NAME,
                format!(
                    "workspace member `{}` has no row in the layering table",
                    member.name
                ),
            ));
            continue;
        };
        for used in member.uses.difference(allowed) {
            let line = dependency_line(&member.manifest, used).unwrap_or(1);
            let allowed: Vec<&str> = allowed.iter().map(String::as_str).collect();
            violations.push(violation(
                &member.manifest_path,
                line,
                NAME,
                format!(
                    "`{}` depends on `{used}`, which the layering of {DOCUMENT} does not allow \
                     (it may depend on: {})",
                    member.name,
                    if allowed.is_empty() {
                        "no crate of ours".to_string()
                    } else {
                        allowed.join(", ")
                    }
                ),
            ));
        }
    }
    violations
}

/// The table after [`HEADING`]: rows `| `crate` | `dep`, `dep` |`, the header and
/// separator rows skipped. The heading's line, or a violation if there is none.
fn parse_table(document: &str) -> Result<(usize, Table), Violation> {
    let mut lines = document.lines().enumerate();
    let Some((heading, _)) = lines.find(|(_, line)| line.trim() == HEADING) else {
        return Err(violation(
            DOCUMENT,
            1,
            NAME,
            format!("no `{HEADING}` section with the crate layering table"),
        ));
    };
    let mut table = Table::new();
    let rows = lines
        .skip_while(|(_, line)| !line.trim_start().starts_with('|'))
        .take_while(|(_, line)| line.trim_start().starts_with('|'));
    for (index, line) in rows {
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
        let Some(name) = cells
            .first()
            .and_then(|cell| quoted(cell).into_iter().next())
        else {
            continue;
        };
        let allowed = cells.get(1).map(|cell| quoted(cell)).unwrap_or_default();
        table.insert(name, (index + 1, allowed.into_iter().collect()));
    }
    Ok((heading + 1, table))
}

/// The `` `quoted` `` names in a table cell.
fn quoted(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "# Architecture\n\n## Layering\n\nText.\n\n\
        | crate | may depend on |\n|---|---|\n\
        | `types` | |\n| `host` | `types` |\n| `radix` | `types`, `host` |\n\nAfter.\n";

    fn member(name: &str, uses: &[&str]) -> Member {
        Member {
            name: name.to_string(),
            manifest_path: format!("crates/{name}/Cargo.toml"),
            manifest: format!(
                "[package]\nname = \"{name}\"\n\n[dependencies]\n{}",
                uses.iter()
                    .map(|dep| format!("{dep}.workspace = true\n"))
                    .collect::<String>()
            )
            .into(),
            uses: uses.iter().map(|dep| dep.to_string()).collect(),
        }
    }

    #[test]
    fn dependencies_the_table_allows_pass() {
        let members = [
            member("types", &[]),
            member("host", &["types"]),
            member("radix", &["host"]),
        ];
        assert!(check_layering(DOC, &members).is_empty());
    }

    #[test]
    fn a_dependency_up_the_layers_is_flagged_at_its_manifest_line() {
        let members = [
            member("types", &[]),
            member("host", &["types", "radix"]),
            member("radix", &["types"]),
        ];
        let v = check_layering(DOC, &members);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(
            (v[0].path.as_str(), v[0].line),
            ("crates/host/Cargo.toml", 6)
        );
        assert!(
            v[0].message.contains("`host` depends on `radix`")
                && v[0].message.ends_with("(it may depend on: types)"),
            "{}",
            v[0].message
        );
    }

    #[test]
    fn members_and_rows_must_match() {
        let members = [
            member("types", &[]),
            member("host", &[]),
            member("fsm", &[]),
        ];
        let v = check_layering(DOC, &members);
        let messages: Vec<(&str, usize)> = v.iter().map(|v| (v.message.as_str(), v.line)).collect();
        assert!(
            messages
                .iter()
                .any(|(m, line)| m.contains("`radix`, which is no") && *line == 11),
            "{messages:?}"
        );
        assert!(
            messages
                .iter()
                .any(|(m, line)| m.contains("`fsm` has no row") && *line == 3),
            "{messages:?}"
        );
    }

    #[test]
    fn a_document_without_the_table_is_flagged() {
        let v = check_layering("# Architecture\n", &[member("types", &[])]);
        assert_eq!(v.len(), 1);
        assert!(v[0].message.contains("## Layering"));
    }
}
