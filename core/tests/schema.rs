//! The filter's parser on the examples of schema/examples/ and on the plugin configs in envoy/*.yaml:
//! valid ones parse, invalid ones fail naming a field. tests/static/test_config_schema.py checks
//! schema/config.schema.json on the same documents, so the schema and the parser agree.
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

#[test]
fn valid_examples_parse() {
    for (name, bytes) in examples("valid") {
        if let Err(e) = parse(&bytes) {
            panic!("parser rejects {name}: {e}");
        }
    }
}

#[test]
fn invalid_examples_fail_naming_a_field() {
    for (name, bytes) in examples("invalid") {
        match parse(&bytes) {
            Ok(_) => panic!("parser accepts {name}"),
            Err(e) => assert!(!e.field.is_empty(), "{name}: error names no field"),
        }
    }
}

/// The plugin configs in the repo's Envoy files parse, too.
#[test]
fn envoy_configs_carry_valid_plugin_config() {
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
            if let Err(e) = parse(json.as_bytes()) {
                panic!("{}: parser rejects the plugin config: {e}", path.display());
            }
            seen += 1;
        }
    }
    assert!(seen > 0);
}
