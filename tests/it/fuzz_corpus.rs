//! The fuzz targets' committed corpora (`fuzz/corpus/<target>/`: realistic seeds, vendor
//! answers, and every input a fuzzer found to break something) as regression tests on stable:
//! each file goes through the same `outbox_relay::fuzzing` function its target calls, so a
//! fixed crash stays fixed without cargo-fuzz or nightly.

use std::path::Path;

fn run(target: &str, f: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} has no seeds", dir.display());
    for path in files {
        let data = std::fs::read(&path).expect("corpus file");
        let outcome = std::panic::catch_unwind(|| f(&data));
        assert!(outcome.is_ok(), "{} broke a promise", path.display());
    }
}

#[test]
fn config() {
    run("config", outbox_relay::fuzzing::config);
}

#[test]
fn fcm() {
    run("fcm", outbox_relay::fuzzing::fcm);
}

#[test]
fn alimtalk() {
    run("alimtalk", outbox_relay::fuzzing::alimtalk);
}

#[test]
fn webhook() {
    run("webhook", outbox_relay::fuzzing::webhook);
}

#[test]
fn row_decode() {
    run("row_decode", outbox_relay::fuzzing::row_decode);
}

#[test]
fn fields_split_on_separator_lines() {
    use outbox_relay::fuzzing::fields;
    assert_eq!(
        fields(b"a\n====\nb\n====\nc", 2),
        [&b"a"[..], b"b\n====\nc"]
    );
    assert_eq!(fields(b"a", 3), [&b"a"[..], b"", b""]);
}
