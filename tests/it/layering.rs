//! The module layering of docs/design.md ("Code layout"), checked on the source: a module may
//! use only modules below it, so dependencies point one way and there are no cycles.

use std::collections::BTreeMap;
use std::path::Path;

/// Each top-level module of `src/` and its layer; a module may import only lower layers
/// (and the crate root's own items: `BoxFuture`, `random_token`, `install_crypto_provider`).
const LAYERS: &[(&str, u8)] = &[
    ("config", 0),
    ("metric", 0),
    ("shutdown", 0),
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

/// The top-level modules each module's files name as `crate::<module>`.
fn imports() -> BTreeMap<String, Vec<(String, String)>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut files = Vec::new();
    let mut dirs = vec![src.clone()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("read src") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    for f in files {
        let rel = f.strip_prefix(&src).expect("under src");
        let first = rel.components().next().expect("a component");
        let module = first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&f).expect("read file");
        for (i, _) in text.match_indices("crate::") {
            let rest = &text[i + 7..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if name != module {
                out.entry(module.clone())
                    .or_default()
                    .push((name, rel.display().to_string()));
            }
        }
    }
    out
}

#[test]
fn modules_only_use_modules_below_them() {
    let layer = |m: &str| LAYERS.iter().find(|(n, _)| *n == m).map(|(_, l)| *l);
    let root_items = ["BoxFuture", "random_token", "install_crypto_provider"];
    let mut wrong = Vec::new();
    for (module, uses) in imports() {
        let Some(own) = layer(&module) else {
            wrong.push(format!("module {module} has no layer in LAYERS"));
            continue;
        };
        for (used, file) in uses {
            if root_items.contains(&used.as_str()) {
                continue;
            }
            match layer(&used) {
                Some(l) if l < own => {}
                Some(_) => wrong.push(format!(
                    "{file}: {module} uses {used}, which is not below it"
                )),
                None => wrong.push(format!(
                    "{file}: {module} uses crate::{used}, not a known module"
                )),
            }
        }
    }
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}
