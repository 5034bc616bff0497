//! Reading configuration files: a plugin JSON, an Envoy bootstrap, or Kubernetes objects
//! (Istio, Envoy Gateway), in JSON or (multi-document) YAML.
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

/// One document of a configuration file.
#[derive(Debug)]
pub enum Doc {
    /// The plugin configuration itself, kept as text so the core parser sees the exact bytes.
    Plugin(String),
    /// An Envoy bootstrap (has `static_resources` or `dynamic_resources`).
    Envoy(Value),
    /// A Kubernetes object: `kind`, `metadata.name`, the whole object.
    Kube {
        kind: String,
        name: String,
        value: Value,
    },
}

pub fn load(path: &Path) -> Result<Vec<Doc>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

pub fn parse(text: &str) -> Result<Vec<Doc>, String> {
    // JSON first: a plugin config must reach Config::from_json byte for byte.
    if let Ok(v) = serde_json::from_str::<Value>(text) {
        return Ok(classify(v, Some(text)).into_iter().collect());
    }
    let mut docs = Vec::new();
    for (i, de) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let v = Value::deserialize(de).map_err(|e| format!("YAML document {i}: {e}"))?;
        docs.extend(classify(v, None));
    }
    if docs.is_empty() {
        return Err("no document in the file".to_string());
    }
    Ok(docs)
}

fn classify(v: Value, raw: Option<&str>) -> Option<Doc> {
    let obj = v.as_object()?;
    if obj.contains_key("static_resources") || obj.contains_key("dynamic_resources") {
        return Some(Doc::Envoy(v));
    }
    if let Some(kind) = obj.get("kind").and_then(Value::as_str) {
        let name = v
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string();
        return Some(Doc::Kube {
            kind: kind.to_string(),
            name,
            value: v,
        });
    }
    // Anything else is taken for a plugin config: the parser names what is wrong with it.
    let text = match raw {
        Some(t) => t.to_string(),
        None => v.to_string(),
    };
    Some(Doc::Plugin(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_plugin_yaml_envoy_and_multi_doc_kube() {
        let d = parse(r#"{"keys":[]}"#).unwrap_or_default();
        assert!(matches!(d.as_slice(), [Doc::Plugin(t)] if t == r#"{"keys":[]}"#));
        let d = parse("static_resources: {}\n").unwrap_or_default();
        assert!(matches!(d.as_slice(), [Doc::Envoy(_)]));
        let d = parse("kind: A\nmetadata: {name: a}\n---\nkind: B\n").unwrap_or_default();
        assert!(
            matches!(d.as_slice(), [Doc::Kube { kind: a, name, .. }, Doc::Kube { kind: b, .. }]
                if a == "A" && name == "a" && b == "B")
        );
        assert!(parse("a: [").is_err());
    }
}
