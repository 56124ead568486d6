//! Rule `no-actix-tokio-in-core`: core crates stay runtime-free, so every actor core
//! runs on any runtime (or none).

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;

use anyhow::Result;

use super::manifest::dependency_line;
use super::metadata::Metadata;
use super::{Repo, Violation, violation};

pub const NAME: &str = "no-actix-tokio-in-core";

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

/// Each core crate's dependencies on actix or tokio, at the line of its manifest that
/// starts the chain.
pub fn check(repo: &Repo) -> Result<Vec<Violation>> {
    let mut violations = Vec::new();
    for dep in core_runtime_dependencies(repo.metadata())? {
        let manifest = repo.read(&dep.manifest).ok();
        let path = repo.relative(&dep.manifest);
        violations.push(runtime_violation(&dep, &path, manifest.as_deref()));
    }
    Ok(violations)
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
    let names = metadata.names();
    let name = |id: &str| names.get(id).copied().unwrap_or(id).to_string();
    let edges = metadata.normal_edges()?;

    let members = metadata.members()?;

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
        NAME,
        format!(
            "core crate `{core}` depends on `{runtime}`{through}; only {} may depend on \
             actix/tokio",
            RUNTIME_CRATES.join(", ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tidy::metadata::fixture::metadata_json;
    use std::path::Path;

    fn chains(json: &str) -> Vec<String> {
        let metadata = crate::tidy::metadata::parse(json).expect("valid metadata");
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
        let metadata = crate::tidy::metadata::parse(&json).expect("valid metadata");
        let deps = core_runtime_dependencies(&metadata).expect("resolve graph");
        assert_eq!(
            deps[1].manifest,
            Path::new("/repo/crates/kvtier-host/Cargo.toml")
        );
        let v = runtime_violation(&deps[1], "crates/kvtier-host/Cargo.toml", None);
        assert_eq!(v.rule, NAME);
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
        let metadata = crate::tidy::metadata::parse(json).expect("valid metadata");
        assert!(core_runtime_dependencies(&metadata).is_err());
        assert!(crate::tidy::metadata::parse("{\"packages\": 1}").is_err());
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
}
