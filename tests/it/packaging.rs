//! The container build (Dockerfile) copies everything `cargo build` reads from the repository:
//! a path the manifest names but the image lacks fails only when someone builds the image,
//! which no other test does (the image's build stage copied `src/` and `benches/` but not
//! the `vendor/` that `[patch.crates-io]` points at), nor `.cargo/config.toml`.

use std::path::Path;

/// The first component of every `path = "..."` in `Cargo.toml` (path dependencies and
/// patches), and of each target's own file.
fn local_paths(manifest: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        for (i, _) in line.match_indices("path = \"") {
            let rest = &line[i + 8..];
            if let Some(end) = rest.find('"') {
                let first = rest[..end].split('/').next().unwrap_or_default();
                if !first.is_empty() && !out.iter().any(|p| p == first) {
                    out.push(first.to_string());
                }
            }
        }
    }
    out
}

#[test]
fn the_image_copies_every_local_path_the_manifest_names() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("read Cargo.toml");
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).expect("read Dockerfile");
    let copied: Vec<&str> = dockerfile
        .lines()
        .filter_map(|l| l.trim().strip_prefix("COPY "))
        .filter(|l| !l.starts_with("--from"))
        .flat_map(|l| l.split_whitespace())
        .collect();
    let paths = local_paths(&manifest);
    // The manifest names src/ (lib and bin) and vendor/ (the patched sqlx-core) at least;
    // an empty list would mean the parsing above broke, not that nothing is needed.
    for expected in ["src", "vendor"] {
        assert!(
            paths.iter().any(|p| p == expected),
            "Cargo.toml should name {expected}/: found {paths:?}"
        );
    }
    let missing: Vec<&String> = paths
        .iter()
        .filter(|p| {
            !copied
                .iter()
                .any(|c| c.trim_start_matches("./").trim_end_matches('/') == p.as_str())
        })
        .collect();
    assert!(
        missing.is_empty(),
        "the Dockerfile's build stage does not COPY {missing:?}, which Cargo.toml names"
    );
    // benches/ is a target of the manifest (`[[bench]]`, found by convention): cargo reads it.
    assert!(
        copied.contains(&"benches"),
        "the Dockerfile does not COPY benches"
    );
    // .cargo/config.toml sets how dependencies are built (the bundled SQLite's options):
    // cargo reads it from the build's directory, so the image must have it too.
    if root.join(".cargo/config.toml").exists() {
        assert!(
            copied
                .iter()
                .any(|c| c.trim_start_matches("./").trim_end_matches('/') == ".cargo"),
            "the Dockerfile does not COPY .cargo, whose config.toml sets how dependencies are built"
        );
    }
}
