//! Rule `no-module-cycles`: inside a crate, sibling modules do not import each other in a
//! circle, so each module can be read (and moved) after the ones it uses.
//!
//! A reference is a `crate::` or `super::` path in code (comments and literals do not
//! count). It links the two modules it connects at the level where their paths part:
//! `crate::runtime::actix` naming `crate::conversation::Step` links `runtime` to
//! `conversation`. A module naming its own ancestor or descendant links nothing, since a
//! parent and its children are one unit. A name the crate root imports (`pub use
//! cache::RadixCore`) names the module it comes from: `crate::RadixCore` links to
//! `cache`, so a re-export cannot hide a circle.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::rc::Rc;

use anyhow::Result;

use super::source::{code_only, is_ident};
use super::{Repo, Violation, line_of, violation};

pub const NAME: &str = "no-module-cycles";

/// A module path inside a crate, `[]` for the crate root.
type Module = Vec<String>;

/// One crate source file: its repository path, its module and its contents.
pub struct SourceFile {
    pub path: String,
    pub module: Module,
    pub contents: Rc<str>,
}

/// Every member's `src/` (binaries under `src/bin/` aside) as one module tree.
pub fn check(repo: &Repo) -> Result<Vec<Violation>> {
    let mut violations = Vec::new();
    for member in repo.metadata().members()? {
        let Some(src) = member.manifest_path.parent().map(|dir| dir.join("src")) else {
            continue;
        };
        let mut files = Vec::new();
        for path in repo.rust_files(&src) {
            let Some(module) = path.strip_prefix(&src).ok().and_then(module_of) else {
                continue;
            };
            files.push(SourceFile {
                path: repo.relative(&path),
                module,
                contents: repo.read(&path)?,
            });
        }
        violations.extend(check_crate(&member.name, &files));
    }
    Ok(violations)
}

/// The module a file under `src/` defines (`lib.rs`: the root, `a/mod.rs` and `a.rs`:
/// `a`); `None` for binaries under `src/bin/`.
fn module_of(relative: &Path) -> Option<Module> {
    let mut parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.first().is_some_and(|first| first == "bin") && parts.len() > 1 {
        return None;
    }
    let file = parts.pop()?;
    let stem = file.strip_suffix(".rs")?;
    if !matches!(
        (parts.is_empty(), stem),
        (true, "lib" | "main") | (_, "mod")
    ) {
        parts.push(stem.to_string());
    }
    Some(parts)
}

/// Where one module links to a sibling: the file and line of the first reference.
#[derive(Debug, Clone)]
struct Site {
    path: String,
    line: usize,
}

/// The circles among sibling modules of one crate.
pub fn check_crate(krate: &str, files: &[SourceFile]) -> Vec<Violation> {
    let known: BTreeSet<&Module> = files.iter().map(|file| &file.module).collect();
    let imported = root_imports(files, &known);
    // Parent module -> (from child, to child) -> first site.
    let mut links: BTreeMap<Module, BTreeMap<(String, String), Site>> = BTreeMap::new();
    for file in files {
        let code = code_only(&file.contents);
        let inline = inline_modules(&code);
        for (offset, target) in references(&code) {
            let mut from = file.module.clone();
            from.extend(
                inline
                    .iter()
                    .filter(|(start, end, _)| (*start..*end).contains(&offset))
                    .map(|(_, _, name)| name.clone()),
            );
            let Some(to) = resolve(&from, &target, &known, &imported) else {
                continue;
            };
            let shared = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            let (Some(a), Some(b)) = (from.get(shared), to.get(shared)) else {
                continue;
            };
            links
                .entry(from[..shared].to_vec())
                .or_default()
                .entry((a.clone(), b.clone()))
                .or_insert_with(|| Site {
                    path: file.path.clone(),
                    line: line_of(&code, offset),
                });
        }
    }
    let mut violations = Vec::new();
    for (parent, edges) in &links {
        for circle in circles(edges.keys()) {
            let shown: Vec<String> = edges
                .iter()
                .filter(|((a, b), _)| circle.contains(a) && circle.contains(b))
                .map(|((a, b), site)| format!("{a} -> {b} ({}:{})", site.path, site.line))
                .collect();
            let Some(first) = edges
                .iter()
                .find(|((a, b), _)| circle.contains(a) && circle.contains(b))
                .map(|(_, site)| site)
            else {
                continue;
            };
            let prefix: String = parent.iter().map(|m| format!("{m}::")).collect();
            let names: Vec<String> = circle.iter().map(|m| format!("`{prefix}{m}`")).collect();
            violations.push(violation(
                &first.path,
                first.line,
                NAME,
                format!(
                    "modules {} of crate `{krate}` import each other: {}",
                    names.join(", "),
                    shown.join(", ")
                ),
            ));
        }
    }
    violations
}

/// The names the crate root imports from its own modules (`use cache::{RadixCore, …}`),
/// with the module each comes from.
fn root_imports(files: &[SourceFile], known: &BTreeSet<&Module>) -> BTreeMap<String, Module> {
    let mut imported = BTreeMap::new();
    let Some(root) = files.iter().find(|file| file.module.is_empty()) else {
        return imported;
    };
    let code = code_only(&root.contents);
    let bytes = code.as_bytes();
    let mut i = 0;
    while let Some(offset) = code[i..].find("use ") {
        let at = i + offset;
        i = at + "use ".len();
        if at > 0 && (is_ident(bytes[at - 1]) || bytes[at - 1] == b':') {
            continue;
        }
        let (paths, _) = path_tree(bytes, i);
        for mut path in paths {
            if path
                .first()
                .is_some_and(|first| first == "crate" || first == "self")
            {
                path.remove(0);
            }
            let Some(name) = path.pop() else {
                continue;
            };
            let from = (1..=path.len())
                .rev()
                .map(|len| path[..len].to_vec())
                .find(|prefix| known.contains(prefix));
            if let Some(from) = from {
                imported.insert(name, from);
            }
        }
    }
    imported
}

/// The module that `target` (an absolute path, or `super::` relative to `from`) names:
/// its longest prefix that is a module of the crate, through the root's imports.
fn resolve(
    from: &[String],
    target: &Target,
    known: &BTreeSet<&Module>,
    imported: &BTreeMap<String, Module>,
) -> Option<Module> {
    let absolute: Vec<String> = match target {
        Target::Crate(path) => match path.split_first() {
            Some((first, rest)) if !known.contains(&vec![first.clone()]) => {
                match imported.get(first) {
                    Some(module) => module.iter().chain(rest).cloned().collect(),
                    None => path.clone(),
                }
            }
            _ => path.clone(),
        },
        Target::Super(ups, path) => {
            let kept = from.len().checked_sub(*ups)?;
            from[..kept].iter().chain(path).cloned().collect()
        }
    };
    (0..=absolute.len())
        .rev()
        .map(|len| absolute[..len].to_vec())
        .find(|prefix| known.contains(prefix))
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// `crate::a::b`: `[a, b]`.
    Crate(Vec<String>),
    /// `super::super::a`: `(2, [a])`.
    Super(usize, Vec<String>),
}

/// Every `crate::` and `super::` path in `code`, with its offset; a group
/// (`crate::{a::X, b::{c, d}}`) gives one path per leaf.
fn references(code: &str) -> Vec<(usize, Target)> {
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts_path = i == 0 || !(is_ident(bytes[i - 1]) || bytes[i - 1] == b':');
        let rest = &bytes[i..];
        if starts_path && rest.starts_with(b"crate::") {
            let (paths, end) = path_tree(bytes, i + "crate::".len());
            found.extend(paths.into_iter().map(|path| (i, Target::Crate(path))));
            i = end.max(i + 1);
        } else if starts_path && rest.starts_with(b"super::") {
            let mut at = i;
            let mut ups = 0;
            while bytes[at..].starts_with(b"super::") {
                ups += 1;
                at += "super::".len();
            }
            let (paths, end) = path_tree(bytes, at);
            found.extend(paths.into_iter().map(|path| (i, Target::Super(ups, path))));
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    found
}

/// The paths of a use tree starting at `at`, and where it ends. `self` and `*` name the
/// path they end.
fn path_tree(bytes: &[u8], at: usize) -> (Vec<Vec<String>>, usize) {
    let mut at = skip_space(bytes, at);
    if bytes.get(at) == Some(&b'{') {
        let mut paths = Vec::new();
        at += 1;
        loop {
            at = skip_space(bytes, at);
            match bytes.get(at) {
                None => break,
                Some(b'}') => {
                    at += 1;
                    break;
                }
                Some(b',') => at += 1,
                Some(_) => {
                    let (sub, end) = path_tree(bytes, at);
                    paths.extend(sub);
                    at = end.max(at + 1);
                }
            }
        }
        return (paths, at);
    }
    if bytes.get(at) == Some(&b'*') {
        return (vec![Vec::new()], at + 1);
    }
    let start = at;
    while bytes.get(at).is_some_and(|&b| is_ident(b)) {
        at += 1;
    }
    let segment = String::from_utf8_lossy(&bytes[start..at]).into_owned();
    if segment.is_empty() || segment == "self" {
        return (vec![Vec::new()], at);
    }
    if bytes[at..].starts_with(b"::") {
        let (subs, end) = path_tree(bytes, at + 2);
        let paths = subs
            .into_iter()
            .map(|sub| std::iter::once(segment.clone()).chain(sub).collect())
            .collect();
        return (paths, end);
    }
    (vec![vec![segment]], at)
}

fn skip_space(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at).is_some_and(u8::is_ascii_whitespace) {
        at += 1;
    }
    at
}

/// The inline modules of `code` (`mod name { .. }`): their byte span and name.
fn inline_modules(code: &str) -> Vec<(usize, usize, String)> {
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while let Some(offset) = code[i..].find("mod ") {
        let at = i + offset;
        i = at + 4;
        if at > 0 && is_ident(bytes[at - 1]) {
            continue;
        }
        let name_start = skip_space(bytes, at + 4);
        let mut name_end = name_start;
        while bytes.get(name_end).is_some_and(|&b| is_ident(b)) {
            name_end += 1;
        }
        let open = skip_space(bytes, name_end);
        if name_end == name_start || bytes.get(open) != Some(&b'{') {
            continue;
        }
        let mut depth = 0usize;
        let mut end = bytes.len();
        for (index, &byte) in bytes.iter().enumerate().skip(open) {
            match byte {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = index;
                        break;
                    }
                }
                _ => {}
            }
        }
        found.push((open, end, code[name_start..name_end].to_string()));
    }
    found
}

/// The strongly connected sets of two or more nodes in the graph of `edges`, sorted.
fn circles<'a>(edges: impl Iterator<Item = &'a (String, String)>) -> Vec<BTreeSet<String>> {
    let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (a, b) in edges {
        next.entry(a).or_default().insert(b);
        next.entry(b).or_default();
    }
    let reach = |from: &str| -> BTreeSet<&str> {
        let mut seen = BTreeSet::new();
        let mut pending = vec![from];
        while let Some(node) = pending.pop() {
            for &to in next.get(node).into_iter().flatten() {
                if seen.insert(to) {
                    pending.push(to);
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&str, BTreeSet<&str>> =
        next.keys().map(|&node| (node, reach(node))).collect();
    let mut found: Vec<BTreeSet<String>> = Vec::new();
    for (&node, reached) in &reaches {
        let circle: BTreeSet<String> = reached
            .iter()
            .filter(|&&other| reaches[other].contains(node))
            .map(|&other| other.to_string())
            .collect();
        if circle.len() > 1 && !found.contains(&circle) {
            found.push(circle);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, module: &[&str], contents: &str) -> SourceFile {
        SourceFile {
            path: path.to_string(),
            module: module.iter().map(|m| m.to_string()).collect(),
            contents: contents.into(),
        }
    }

    #[test]
    fn files_map_to_modules() {
        let module = |path: &str| module_of(Path::new(path));
        assert_eq!(module("lib.rs"), Some(vec![]));
        assert_eq!(module("main.rs"), Some(vec![]));
        assert_eq!(module("a.rs"), Some(vec!["a".to_string()]));
        assert_eq!(module("a/mod.rs"), Some(vec!["a".to_string()]));
        assert_eq!(
            module("a/b.rs"),
            Some(vec!["a".to_string(), "b".to_string()])
        );
        assert_eq!(module("bin/tool.rs"), None);
    }

    #[test]
    fn use_trees_expand_to_one_path_per_leaf() {
        let refs =
            references("use crate::{a::X, b::{self, c::*}};\nfn f() { super::super::d::g() }");
        let paths: Vec<Target> = refs.into_iter().map(|(_, target)| target).collect();
        let crate_path = |p: &[&str]| Target::Crate(p.iter().map(|s| s.to_string()).collect());
        assert_eq!(
            paths,
            vec![
                crate_path(&["a", "X"]),
                crate_path(&["b"]),
                crate_path(&["b", "c"]),
                Target::Super(2, vec!["d".to_string(), "g".to_string()]),
            ]
        );
    }

    #[test]
    fn siblings_importing_each_other_are_a_circle() {
        let files = [
            file("src/lib.rs", &[], "mod a; mod b; pub use a::X;"),
            file("src/a.rs", &["a"], "use crate::b::Y;\npub struct X;"),
            file("src/b/mod.rs", &["b"], "pub struct Y;"),
            file(
                "src/b/inner.rs",
                &["b", "inner"],
                "// crate::a is only a comment\nfn f() -> super::super::a::X { todo!() }",
            ),
        ];
        let v = check_crate("demo", &files);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!((v[0].path.as_str(), v[0].line), ("src/a.rs", 1));
        assert!(
            v[0].message.contains("`a`, `b`")
                && v[0].message.contains("a -> b (src/a.rs:1)")
                && v[0].message.contains("b -> a (src/b/inner.rs:2)"),
            "{}",
            v[0].message
        );
    }

    #[test]
    fn parents_children_comments_and_one_way_links_are_not_circles() {
        let files = [
            file(
                "src/lib.rs",
                &[],
                "mod a; mod b; use crate::a::X; use b::Y;",
            ),
            file(
                "src/a.rs",
                &["a"],
                "use crate::b::Y; use crate::X; /// [`crate::b`]\nmod tests { use super::*; }",
            ),
            file(
                "src/b/mod.rs",
                &["b"],
                "mod c; use self::c::Z; use c::Z as W;",
            ),
            file(
                "src/b/c.rs",
                &["b", "c"],
                "use super::Y; const S: &str = \"crate::a\"; // crate::a\n",
            ),
        ];
        assert!(check_crate("demo", &files).is_empty());
    }

    #[test]
    fn a_name_the_root_imports_links_to_its_module() {
        let files = [
            file(
                "src/lib.rs",
                &[],
                "mod a; mod b;\npub use a::X;\npub(crate) use b::{inner::Y as Z, W};",
            ),
            file("src/a.rs", &["a"], "use crate::W;\npub struct X;"),
            file("src/b/mod.rs", &["b"], "mod inner; pub struct W;"),
            file("src/b/inner.rs", &["b", "inner"], "fn f(_: crate::X) {}"),
        ];
        let v = check_crate("demo", &files);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].message.contains("a -> b (src/a.rs:1)")
                && v[0].message.contains("b -> a (src/b/inner.rs:1)"),
            "{}",
            v[0].message
        );
    }

    #[test]
    fn a_circle_in_a_nested_module_names_its_parent() {
        let files = [
            file("src/lib.rs", &[], "mod m;"),
            file("src/m/mod.rs", &["m"], "mod x; mod y;"),
            file("src/m/x.rs", &["m", "x"], "use super::y::B;"),
            file("src/m/y.rs", &["m", "y"], "use crate::m::x::A;"),
            // An inline test module's `super` is the file's own module.
            file("src/m/z.rs", &["m", "z"], "mod tests { use super::Z; }"),
        ];
        let v = check_crate("demo", &files);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].message.contains("`m::x`, `m::y`"), "{}", v[0].message);
    }
}
