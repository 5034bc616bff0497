//! The shipped JSON Schema and the filter's parser agree on every example.
#![cfg(not(target_arch = "wasm32"))]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use mcp_resume_core::config::Config;
use std::path::{Path, PathBuf};

/// A stand-in for every variable a config names (`secret_env`, `token_env`): the base64 of
/// 32 fixed random bytes, a valid key and a valid token.
fn stand_in(_: &str) -> Option<String> {
    Some("ja4ge+hsvYqGv+f0Zcw23So/A0PrUrPK5aYHrBCNJ2U=".to_string())
}

fn parse(bytes: &[u8]) -> Result<Config, mcp_resume_core::config::ConfigError> {
    Config::from_json_with_env(bytes, &stand_in)
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn examples(kind: &str) -> Vec<(String, Vec<u8>)> {
    let dir = root().join("schema/examples").join(kind);
    let mut out: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no examples in {}", dir.display());
    out
}

fn validator() -> jsonschema::Validator {
    let schema: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root().join("schema/config.schema.json")).unwrap())
            .unwrap();
    jsonschema::validator_for(&schema).unwrap()
}

#[test]
fn valid_examples_pass_both() {
    let v = validator();
    for (name, bytes) in examples("valid") {
        let doc: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert!(v.is_valid(&doc), "schema rejects {name}");
        if let Err(e) = parse(&bytes) {
            panic!("parser rejects {name}: {e}");
        }
    }
}

#[test]
fn invalid_examples_fail_both() {
    let v = validator();
    for (name, bytes) in examples("invalid") {
        let doc: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert!(!v.is_valid(&doc), "schema accepts {name}");
        match parse(&bytes) {
            Ok(_) => panic!("parser accepts {name}"),
            Err(e) => assert!(!e.field.is_empty(), "{name}: error names no field"),
        }
    }
}

/// The plugin configs in the repo's Envoy files are valid for both, too.
#[test]
fn envoy_configs_carry_valid_plugin_config() {
    let v = validator();
    let mut seen = 0;
    for entry in std::fs::read_dir(root().join("envoy")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        // The plugin config is the indented JSON block under `value: |`.
        for block in text.split("value: |").skip(1) {
            let mut lines = block.lines().skip(1).peekable();
            let indent = lines
                .peek()
                .map(|l| l.len() - l.trim_start().len())
                .unwrap_or(0);
            let json: Vec<&str> = lines
                .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() >= indent)
                .collect();
            let json = json.join("\n");
            let doc: serde_json::Value = serde_json::from_str(&json)
                .unwrap_or_else(|e| panic!("{}: plugin config is not JSON: {e}", path.display()));
            assert!(
                v.is_valid(&doc),
                "schema rejects plugin config in {}",
                path.display()
            );
            parse(json.as_bytes()).unwrap();
            seen += 1;
        }
    }
    assert!(seen > 0);
}
