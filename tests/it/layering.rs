//! The module layering of docs/design.md ("Code layout"), checked on the source: a module may
//! use only modules below it, so dependencies point one way and there are no cycles. Checked
//! at three levels: the crate's top-level modules, the store's inner folders (a shared part,
//! the callers, one folder per database), and every folder's files among themselves (no two
//! sibling modules use each other, directly or round a circle).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module of `src/` and its layer; a module may import only lower layers
/// (and the crate root's own items: `BoxFuture`, `random_token`, `install_crypto_provider`).
const LAYERS: &[(&str, u8)] = &[
    ("config", 0),
    ("metric", 0),
    ("shutdown", 0),
    ("runtime", 0),
    ("sink", 1),
    ("store", 2),
    ("lease", 3),
    ("fuzzing", 3),
    ("telemetry", 4),
    ("housekeeping", 4),
    ("relay", 5),
    ("console", 5),
    ("cli", 6),
];

/// The store's inner modules and their layers (docs/design.md, "Code layout"): the shared
/// part, then the callers (each defining what it needs from a database), then one folder per
/// database, then the engine that picks one and the store the rest of the relay holds. No
/// inner module uses the store's root (`store/mod.rs` only declares and re-exports).
const STORE_LAYERS: &[(&str, u8)] = &[
    ("model", 0),
    ("fault", 0),
    ("sql", 1),
    ("db", 2),
    ("claim", 3),
    ("queue", 3),
    ("schema", 3),
    ("locks", 3),
    ("admin", 4),
    ("postgres", 5),
    ("mysql", 5),
    ("sqlite", 5),
    ("engine", 6),
    ("sql_store", 7),
];

/// A source file and its module path (`src/store/claim/picks.rs`: `store::claim::picks`).
struct File {
    path: PathBuf,
    module: Vec<String>,
    text: String,
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `src/`, with its module path.
fn files() -> Vec<File> {
    let src = src();
    let mut out = Vec::new();
    let mut dirs = vec![src.clone()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("read src") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(&src).expect("under src");
                let mut module: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().to_string())
                    .collect();
                let last = module.pop().expect("a file name");
                match last.trim_end_matches(".rs") {
                    "mod" | "lib" | "main" => {}
                    name => module.push(name.to_string()),
                }
                let text = std::fs::read_to_string(&p).expect("read file");
                out.push(File {
                    path: rel.to_path_buf(),
                    module,
                    text,
                });
            }
        }
    }
    out
}

/// Whether `module` (a path from the crate root) is a module of its own (a file or folder).
fn is_module(module: &[String]) -> bool {
    let mut p = src();
    for m in module {
        p.push(m);
    }
    p.is_dir() || p.with_extension("rs").is_file()
}

/// Every path a file names from `crate::`, `super::` or `self::`, resolved to the crate root
/// (`use super::{a, b::c}` gives two paths).
fn references(f: &File) -> Vec<Vec<String>> {
    let text = &f.text;
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let is_ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let inline = inline_modules(text);
    for start in ["crate::", "super::", "self::"] {
        for (i, _) in text.match_indices(start) {
            if i > 0 && (is_ident(bytes[i - 1]) || bytes[i - 1] == b':') {
                continue;
            }
            // Inside an inline module (`mod tests { use super::*; }`), `super` is the file's
            // own module.
            let inline = inline.iter().any(|(from, to)| (*from..*to).contains(&i));
            let mut base: Vec<String> = match start {
                "crate::" => Vec::new(),
                "super::" if inline => f.module.clone(),
                "super::" => parent(f),
                _ => f.module.clone(),
            };
            let mut rest = &text[i + start.len()..];
            while let Some(r) = rest.strip_prefix("super::") {
                base.pop();
                rest = r;
            }
            for tail in paths(rest) {
                let mut path = base.clone();
                path.extend(tail);
                out.push(path);
            }
        }
    }
    out
}

/// The byte ranges of the inline modules (`mod name { ... }`) in `text`. Braces inside string
/// literals are skipped; the rest of the file's braces balance.
fn inline_modules(text: &str) -> Vec<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    for (at, _) in text.match_indices("mod ") {
        if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
            continue;
        }
        let rest = &text[at + 4..];
        let name_len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let after = rest[name_len..].trim_start();
        if name_len == 0 || !after.starts_with('{') {
            continue;
        }
        let open = text.len() - after.len();
        let (mut depth, mut in_str, mut i) = (0usize, false, open);
        while i < bytes.len() {
            match bytes[i] {
                b'\\' if in_str => i += 1,
                // A char literal (`'"'`, `'{'`, `'\''`), not a lifetime.
                b'\'' if !in_str && bytes.get(i + 2) == Some(&b'\'') => i += 2,
                b'\'' if !in_str && bytes.get(i + 1) == Some(&b'\\') => i += 3,
                b'"' => in_str = !in_str,
                b'{' if !in_str => depth += 1,
                b'}' if !in_str => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        out.push((open, i));
    }
    out
}

/// The module `super` names in `f`: a `mod.rs` file's parent is its folder's parent.
fn parent(f: &File) -> Vec<String> {
    let mut p = f.module.clone();
    p.pop();
    p
}

/// The `a::b::` segments at the start of `s`, and what follows them.
fn segments<'s>(mut s: &'s str, ident: &dyn Fn(&str) -> String) -> (Vec<String>, &'s str) {
    let mut out = Vec::new();
    loop {
        let name = ident(s);
        if name.is_empty() {
            return (out, s);
        }
        s = &s[name.len()..];
        out.push(name);
        match s.strip_prefix("::") {
            Some(r) => s = r,
            None => return (out, s),
        }
    }
}

/// The paths at the start of `rest`: `a::b::C` gives `a::b::C`; `a::{b, c::D}` gives
/// `a::b` and `a::c::D` (one level of braces is enough for the module each path names).
fn paths(rest: &str) -> Vec<Vec<String>> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let (lead, after) = segments(rest, &ident);
    let Some(group) = after.strip_prefix('{') else {
        return if lead.is_empty() { vec![] } else { vec![lead] };
    };
    let mut out = Vec::new();
    let mut depth = 0;
    let mut item_start = true;
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => item_start = true,
            c if c.is_whitespace() => {}
            _ if item_start && depth == 0 => {
                let (tail, _) = segments(&group[i..], &ident);
                if !tail.is_empty() {
                    let mut path = lead.clone();
                    path.extend(tail);
                    out.push(path);
                }
                item_start = false;
            }
            _ => {}
        }
    }
    out
}

#[test]
fn modules_only_use_modules_below_them() {
    let layer = |m: &str| LAYERS.iter().find(|(n, _)| *n == m).map(|(_, l)| *l);
    let root_items = ["BoxFuture", "random_token", "install_crypto_provider"];
    let mut wrong = Vec::new();
    for f in files() {
        let Some(module) = f.module.first() else {
            continue;
        };
        let Some(own) = layer(module) else {
            wrong.push(format!("module {module} has no layer in LAYERS"));
            continue;
        };
        for used in references(&f) {
            let Some(used) = used.first() else { continue };
            if used == module || root_items.contains(&used.as_str()) {
                continue;
            }
            match layer(used) {
                Some(l) if l < own => {}
                Some(_) => wrong.push(format!(
                    "{}: {module} uses {used}, which is not below it",
                    f.path.display()
                )),
                None => wrong.push(format!(
                    "{}: {module} uses crate::{used}, not a known module",
                    f.path.display()
                )),
            }
        }
    }
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}

#[test]
fn the_stores_folders_only_use_folders_below_them() {
    let layer = |m: &str| STORE_LAYERS.iter().find(|(n, _)| *n == m).map(|(_, l)| *l);
    let mut wrong = Vec::new();
    let mut seen = BTreeSet::new();
    for f in files().into_iter().filter(|f| f.module.len() >= 2) {
        if f.module[0] != "store" {
            continue;
        }
        let inner = &f.module[1];
        seen.insert(inner.clone());
        let Some(own) = layer(inner) else {
            wrong.push(format!("store::{inner} has no layer in STORE_LAYERS"));
            continue;
        };
        for used in references(&f) {
            if used.first().map(String::as_str) != Some("store") || used.len() < 2 {
                continue;
            }
            let target = &used[1];
            if target == inner {
                continue;
            }
            if !is_module(&used[..2]) {
                wrong.push(format!(
                    "{}: store::{inner} uses store::{target}, an item of the store's root",
                    f.path.display()
                ));
                continue;
            }
            match layer(target) {
                Some(l) if l < own => {}
                _ => wrong.push(format!(
                    "{}: store::{inner} uses store::{target}, which is not below it",
                    f.path.display()
                )),
            }
        }
    }
    for (name, _) in STORE_LAYERS {
        assert!(
            seen.contains(*name),
            "STORE_LAYERS names store::{name}, which has no file"
        );
    }
    assert!(
        wrong.is_empty(),
        "store layering broken:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_two_sibling_modules_use_each_other() {
    // Edges between the children of each folder: (folder, from child, to child). A folder's
    // own `mod.rs` declares and re-exports its children; it is not one of them.
    let mut edges: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for f in files() {
        for used in references(&f) {
            let common = f
                .module
                .iter()
                .zip(&used)
                .take_while(|(a, b)| a == b)
                .count();
            if common >= f.module.len() || common >= used.len() {
                continue;
            }
            let folder = f.module[..common].to_vec();
            let (from, to) = (&f.module[common], &used[common]);
            if !is_module(&used[..=common]) {
                continue;
            }
            edges
                .entry(folder)
                .or_default()
                .entry(from.clone())
                .or_default()
                .insert(to.clone());
        }
    }
    let mut circles = Vec::new();
    for (folder, graph) in &edges {
        if let Some(circle) = find_circle(graph) {
            circles.push(format!("{}: {}", folder.join("::"), circle.join(" -> ")));
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

/// A circle in `graph`, if any: the names along it, the first repeated at the end.
fn find_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut circle = path[at..].to_vec();
            circle.push(node.to_string());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(c) = visit(node, graph, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn the_reference_reader_resolves_paths() {
    let f = File {
        path: PathBuf::from("store/claim/picks.rs"),
        module: ["store", "claim", "picks"].map(String::from).to_vec(),
        text: "use super::cursor::Floors;\nuse super::super::sql::{Sql, columns::State};\n\
               use crate::store::db::Db; use self::inner::X;"
            .into(),
    };
    let refs: BTreeSet<String> = references(&f).into_iter().map(|p| p.join("::")).collect();
    let want: BTreeSet<String> = [
        "store::claim::cursor::Floors",
        "store::sql::Sql",
        "store::sql::columns::State",
        "store::db::Db",
        "store::claim::picks::inner::X",
    ]
    .map(String::from)
    .into();
    assert_eq!(refs, want);
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(
        find_circle(&g),
        Some(vec!["a".into(), "b".into(), "a".into()])
    );
}
