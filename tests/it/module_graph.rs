//! ARCHITECTURE.md's claim "within crates there are no import cycles", checked: the modules of
//! each crate of the workspace (every member with a `src/` folder, read from the root
//! Cargo.toml, so that a new crate is checked too), read as text, and what each names through `crate::` and
//! `super::` outside its tests. A module naming one of its ancestors (a file of a module folder
//! using its `mod.rs`) is how folders work and does not count; any other cycle fails, at the
//! grain of a crate's top-level modules and at the grain of files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// The workspace's root folder.
fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The workspace's members that have a `src/` folder, by folder.
fn crates_with_modules() -> Vec<String> {
    let manifest = std::fs::read_to_string(workspace().join("Cargo.toml")).unwrap();
    let manifest: toml::Table = toml::from_str(&manifest).unwrap();
    let members = manifest["workspace"]["members"].as_array().unwrap();
    members
        .iter()
        .map(|member| member.as_str().unwrap().to_owned())
        .filter(|member| workspace().join(member).join("src").is_dir())
        .collect()
}

#[test]
fn no_module_imports_within_a_crate_form_a_cycle() {
    let crates = crates_with_modules();
    for expected in [
        ".",
        "forge-core",
        "forge-scheduler",
        "forge-admin",
        "forge-alerts",
    ] {
        assert!(
            crates.iter().any(|krate| krate == expected),
            "{expected} is not among the crates read: {crates:?}"
        );
    }
    let mut cycles = Vec::new();
    for krate in &crates {
        let modules = read_modules(&workspace().join(krate).join("src"));
        let files = edges(&modules, |module| module.clone());
        let tops = edges(&modules, |module| module[..1].to_vec());
        for graph in [files, tops] {
            if let Some(cycle) = find_cycle(&graph) {
                let names: Vec<String> = cycle.iter().map(|module| module.join("::")).collect();
                cycles.push(format!("{krate}: {}", names.join(" -> ")));
            }
        }
    }
    assert!(cycles.is_empty(), "import cycles: {cycles:#?}");
}

/// Every module of `src` (not the crate root) and the source of its file, tests cut off.
fn read_modules(src: &Path) -> BTreeMap<Module, String> {
    let mut modules = BTreeMap::new();
    let mut folders = vec![src.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
                continue;
            }
            if path.extension().is_none_or(|ext| ext != "rs") {
                continue;
            }
            let relative = path.strip_prefix(src).unwrap().with_extension("");
            let mut module: Module = relative
                .iter()
                .map(|part| part.to_string_lossy().into_owned())
                .collect();
            if module.last().is_some_and(|last| last == "mod") {
                module.pop();
            }
            if module.is_empty() || module == ["lib"] || module == ["main"] || module[0] == "bin" {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            let code: String = code
                .lines()
                .filter(|line| !line.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            modules.insert(module, code);
        }
    }
    modules
}

/// The graph of `modules` at the grain `grain` gives: an edge for each path named through
/// `crate::` or `super::`, to the longest module it starts with, unless that is the naming
/// module itself or one of its ancestors.
fn edges(
    modules: &BTreeMap<Module, String>,
    grain: impl Fn(&Module) -> Module,
) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut graph: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, code) in modules {
        for path in named_paths(module, code) {
            let Some(target) = (1..=path.len())
                .rev()
                .map(|len| path[..len].to_vec())
                .find(|prefix| modules.contains_key(prefix))
            else {
                continue;
            };
            if module.starts_with(&target) {
                continue;
            }
            let (from, to) = (grain(module), grain(&target));
            if from != to {
                graph.entry(from).or_default().insert(to);
            }
        }
    }
    graph
}

/// The paths `code` names from its crate's root: `crate::a::b` and `crate::{a, b::c}` as
/// `[a, b]`, `[a]`, `[b, c]`; `super::x` relative to `module`.
fn named_paths(module: &Module, code: &str) -> Vec<Module> {
    let mut paths = Vec::new();
    for (prefix, base) in [
        ("crate::", Vec::new()),
        ("super::", module[..module.len() - 1].to_vec()),
    ] {
        for (at, _) in code.match_indices(prefix) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            collect_tree(&code[at + prefix.len()..], &base, &mut paths);
        }
    }
    paths
}

/// Reads one use tree at the start of `text` (`a::b`, `{a, b::{c, d}}`) into `paths`.
fn collect_tree(text: &str, base: &[String], paths: &mut Vec<Module>) {
    let mut path = base.to_vec();
    let mut rest = text;
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            for item in split_group(group) {
                collect_tree(item.trim(), &path, paths);
            }
            return;
        }
        let ident: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if ident.is_empty() || ident == "self" {
            break;
        }
        path.push(ident.clone());
        rest = &rest[ident.len()..];
        match rest.strip_prefix("::") {
            Some(next) => rest = next,
            None => break,
        }
    }
    if path.len() > base.len() {
        paths.push(path);
    }
}

/// The items of a `{...}` group whose opening brace is already consumed.
fn split_group(group: &str) -> Vec<&str> {
    let (mut depth, mut start, mut items) = (0usize, 0, Vec::new());
    for (at, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[start..at]);
                return items;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    items
}

/// A cycle of `graph`, if it has one (depth-first search).
fn find_cycle(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    fn visit(
        node: &Module,
        graph: &BTreeMap<Module, BTreeSet<Module>>,
        done: &mut BTreeSet<Module>,
        stack: &mut Vec<Module>,
    ) -> Option<Vec<Module>> {
        if let Some(at) = stack.iter().position(|seen| seen == node) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(node.clone());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, done, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(node.clone());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}

#[test]
fn paths_are_read_from_use_trees() {
    let module = vec!["jobs".to_owned(), "worker".to_owned()];
    let paths = named_paths(
        &module,
        "use crate::{error::Error, role::{Role, Epoch}};\nuse super::attempt::run;\nx::crate::no",
    );
    let names: Vec<String> = paths.iter().map(|path| path.join("::")).collect();
    assert_eq!(
        names,
        [
            "error::Error",
            "role::Role",
            "role::Epoch",
            "jobs::attempt::run"
        ]
    );
}
