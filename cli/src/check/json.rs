//! Reading the JSON of a proxy configuration (YAML parsed to JSON): missing fields are empty.
use serde_json::Value;

pub(super) fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|x| x.as_str().map(str::to_string))
        .collect()
}

pub(super) fn type_of(v: &Value) -> &str {
    v.get("@type")
        .and_then(Value::as_str)
        .map(|t| t.rsplit('/').next().unwrap_or(t))
        .unwrap_or("")
}

pub(super) fn arr(v: &Value, key: &str) -> Vec<Value> {
    v.get(key)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

pub(super) fn str_of<'a>(v: &'a Value, ptr: &str) -> Option<&'a str> {
    v.pointer(ptr).and_then(Value::as_str)
}

/// A protobuf Duration as Envoy or Kubernetes YAML writes it: "0s", "1.5s", "250ms", "1h" or
/// `{seconds, nanos}`. Returns seconds.
pub(super) fn duration_secs(v: &Value) -> Option<f64> {
    if let Some(o) = v.as_object() {
        let s = o.get("seconds").and_then(Value::as_f64).unwrap_or(0.0);
        let n = o.get("nanos").and_then(Value::as_f64).unwrap_or(0.0);
        return Some(s + n / 1e9);
    }
    let s = v.as_str()?.trim();
    let units = [("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)];
    for (suffix, mult) in units {
        if let Some(num) = s.strip_suffix(suffix) {
            if let Ok(x) = num.parse::<f64>() {
                return Some(x * mult);
            }
        }
    }
    s.parse::<f64>().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration_secs(&Value::from("0s")), Some(0.0));
        assert_eq!(duration_secs(&Value::from("250ms")), Some(0.25));
        assert_eq!(duration_secs(&Value::from("1h")), Some(3600.0));
        assert_eq!(duration_secs(&serde_json::json!({"seconds": 2})), Some(2.0));
        assert_eq!(duration_secs(&Value::from("x")), None);
    }
}
