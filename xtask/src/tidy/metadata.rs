//! The parts of `cargo metadata --format-version 1` that the rules read.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

/// The parts of `cargo metadata --format-version 1` output the rules read.
#[derive(Debug, Deserialize)]
pub struct Metadata {
    packages: Vec<Package>,
    workspace_members: Vec<String>,
    /// Absent under `--no-deps`.
    resolve: Option<Resolve>,
    pub workspace_root: PathBuf,
}

#[derive(Debug, Deserialize)]
pub struct Package {
    pub id: String,
    pub name: String,
    pub manifest_path: PathBuf,
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
    pub fn package(&self, id: &str) -> Option<&Package> {
        self.packages.iter().find(|p| p.id == id)
    }

    /// The workspace members, sorted by name.
    pub fn members(&self) -> Result<Vec<&Package>> {
        let mut members = self
            .workspace_members
            .iter()
            .map(|id| {
                self.package(id)
                    .with_context(|| format!("cargo metadata: workspace member `{id}` not listed"))
            })
            .collect::<Result<Vec<_>>>()?;
        members.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(members)
    }

    /// The workspace members' manifests, sorted.
    pub fn member_manifests(&self) -> Result<Vec<PathBuf>> {
        let mut manifests: Vec<PathBuf> = self
            .members()?
            .into_iter()
            .map(|p| p.manifest_path.clone())
            .collect();
        manifests.sort();
        Ok(manifests)
    }

    /// Every package's name by id.
    pub fn names(&self) -> HashMap<&str, &str> {
        self.packages
            .iter()
            .map(|p| (p.id.as_str(), p.name.as_str()))
            .collect()
    }

    /// The resolved graph's normal (non-dev, non-build) dependencies: package id to the
    /// ids it depends on.
    pub fn normal_edges(&self) -> Result<HashMap<&str, Vec<&str>>> {
        let Some(resolve) = &self.resolve else {
            bail!("cargo metadata: no `resolve` graph (was it run with --no-deps?)");
        };
        Ok(resolve
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
            .collect())
    }
}

pub fn parse(json: &str) -> Result<Metadata> {
    serde_json::from_str(json).context("parsing `cargo metadata` output")
}

#[cfg(test)]
pub mod fixture {
    /// A `cargo metadata --format-version 1` document for a workspace at `/repo`:
    /// `members` are `(name, [(dependency, kind)])` with kind `null`, `"dev"` or
    /// `"build"`; `externals` are registry packages with their (normal) dependencies.
    pub fn metadata_json(
        members: &[(&str, &[(&str, &str)])],
        externals: &[(&str, &[&str])],
    ) -> String {
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
}
