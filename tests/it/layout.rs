//! The shape of `src/`, checked: the top-level modules depend on each other without a circle, so
//! each can be read (and tested) knowing only the ones below it. A table two modules both need
//! is a leaf they both import (`routes`), never one of them reaching into the other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// `module -> modules it names as crate::X`, for every top-level module of `src/` (a file
/// `src/x.rs` or a folder `src/x/`; `lib.rs`, the composition root, and `main.rs` are above
/// them all).
fn dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = vec![src.clone()];
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
        let relative = path.strip_prefix(&src).unwrap();
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
        for reference in text.split("crate::").skip(1) {
            let name: String = reference
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if !name.is_empty() && name != module {
                used.insert(name);
            }
        }
    }
    graph
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
    let graph = dependencies();
    assert!(
        graph.contains_key("registry") && graph.contains_key("http"),
        "{graph:?}"
    );
    assert_eq!(circle(&graph), None, "{graph:#?}");
}

#[test]
fn the_circle_finder_finds_the_circle_metrics_and_http_once_made() {
    let mut graph = dependencies();
    graph
        .entry("metrics".into())
        .or_default()
        .insert("http".into());
    let found = circle(&graph).expect("http uses metrics; metrics using http closes a circle");
    assert!(found.contains(&"http".to_owned()) && found.contains(&"metrics".to_owned()));
}
