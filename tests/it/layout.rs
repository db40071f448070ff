//! The shape of `src/` and of the load tool's `tools/ttlwheel-load/src/`, checked: the top-level
//! modules depend on each other without a circle, so each can be read (and tested) knowing only
//! the ones below it. A table two modules both need is a leaf they both import (`routes`; the
//! tool's `resp`), never one of them reaching into the other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `module -> modules it names as crate::X` (or in `crate::{X, ...}`), for every top-level module
/// of the crate whose sources are in `src` (a file `x.rs` or a folder `x/`; `lib.rs`, the
/// composition root, and `main.rs` are above them all, and names that are not modules, such as
/// items of the root, are left out).
fn dependencies(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = vec![src.to_path_buf()];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(
                std::fs::read_dir(&path)
                    .unwrap()
                    .map(|entry| entry.unwrap().path()),
            );
            continue;
        }
        if path.extension().is_none_or(|ext| ext != "rs") {
            continue;
        }
        let relative = path.strip_prefix(src).unwrap();
        let first = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_owned();
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let used = graph.entry(module.clone()).or_default();
        for name in named_after_crate(&text) {
            if name != module {
                used.insert(name);
            }
        }
    }
    let modules: BTreeSet<String> = graph.keys().cloned().collect();
    for used in graph.values_mut() {
        used.retain(|name| modules.contains(name));
    }
    graph
}

/// The first path segment after each `crate::`, and each one in a `crate::{...}` group.
fn named_after_crate(text: &str) -> Vec<String> {
    let segment = |text: &str| -> String {
        text.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect()
    };
    let mut names = Vec::new();
    for reference in text.split("crate::").skip(1) {
        match reference.strip_prefix('{') {
            Some(group) => {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                names.extend(group.split(',').map(segment));
            }
            None => names.push(segment(reference)),
        }
    }
    names.retain(|name| !name.is_empty());
    names
}

fn service_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn load_tool_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/ttlwheel-load/src")
}

/// A circle in `graph`, if there is one, as the modules along it.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        module: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|on_path| on_path == module) {
            let mut found = path[start..].to_vec();
            found.push(module.to_owned());
            return Some(found);
        }
        if !done.insert(module.to_owned()) {
            return None;
        }
        path.push(module.to_owned());
        for next in graph.get(module).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|module| visit(module, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_top_level_modules_import_each_other_without_a_circle() {
    let graph = dependencies(&service_src());
    assert!(
        graph.contains_key("registry") && graph.contains_key("http"),
        "{graph:?}"
    );
    assert_eq!(circle(&graph), None, "{graph:#?}");
}

#[test]
fn the_circle_finder_finds_the_circle_metrics_and_http_once_made() {
    let mut graph = dependencies(&service_src());
    graph
        .entry("metrics".into())
        .or_default()
        .insert("http".into());
    let found = circle(&graph).expect("http uses metrics; metrics using http closes a circle");
    assert!(found.contains(&"http".to_owned()) && found.contains(&"metrics".to_owned()));
}

#[test]
fn the_load_tools_modules_import_each_other_without_a_circle() {
    let graph = dependencies(&load_tool_src());
    assert!(
        graph["peers"].contains("driver") && graph["driver"].contains("resp"),
        "{graph:?}"
    );
    assert_eq!(circle(&graph), None, "{graph:#?}");
}

#[test]
fn the_circle_finder_finds_the_circle_driver_and_peers_once_made() {
    let mut graph = dependencies(&load_tool_src());
    graph
        .entry("driver".into())
        .or_default()
        .insert("peers".into());
    let found = circle(&graph).expect("peers uses driver; driver using peers closes a circle");
    assert!(found.contains(&"driver".to_owned()) && found.contains(&"peers".to_owned()));
}

#[test]
fn names_after_crate_are_read_alone_and_in_groups() {
    assert_eq!(
        named_after_crate("use crate::stats::Durations;\nuse crate::{register, wire::Conn};"),
        ["stats", "register", "wire"]
    );
}
