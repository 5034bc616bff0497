//! Replays every committed corpus input (`fuzz/corpus/<target>/*`) through its target body on
//! stable: crashes the fuzzer once found stay fixed, and every target keeps a corpus.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

#[test]
fn every_corpus_input_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../corpus");
    let mut failures = Vec::new();
    for (name, body) in fuzz_replay::TARGETS {
        let dir = root.join(name);
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "{name}: empty corpus");
        for f in &files {
            let data = std::fs::read(f).unwrap();
            if std::panic::catch_unwind(|| body(&data)).is_err() {
                failures.push(f.display().to_string());
            }
        }
        eprintln!("{name}: {} inputs", files.len());
    }
    assert!(failures.is_empty(), "failing inputs: {failures:#?}");
}

#[test]
fn every_fuzz_binary_has_a_body_and_a_corpus() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut bins: Vec<String> = std::fs::read_dir(root.join("fuzz_targets"))
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            p.file_stem().unwrap().to_string_lossy().into_owned()
        })
        .collect();
    bins.sort();
    let mut names: Vec<String> = fuzz_replay::TARGETS
        .iter()
        .map(|(n, _)| n.to_string())
        .collect();
    names.sort();
    assert_eq!(bins, names);
}
