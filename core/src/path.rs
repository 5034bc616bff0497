//! Which requests are MCP requests: `:path` normalization and the configured paths.
//!
//! The rule: the query (and a fragment) is dropped; percent-encoded unreserved characters
//! (`A-Z a-z 0-9 - . _ ~`, RFC 3986) are decoded, other escapes are kept as they are; runs of
//! slashes become one; `.` and `..` segments are resolved (never above the root). A configured
//! exact path then matches the normalized path with or without one trailing slash (`/mcp`
//! matches `/mcp` and `/mcp/`, not `/mcp//x`); a configured prefix (`/tenants/*`) matches any
//! normalized path that starts with it. So `//mcp`, `/a/../mcp`, `/%6dcp?x` and `/mcp/.` are all
//! `/mcp`: a client cannot step around the guard with a spelling a replica reads as its endpoint.
use std::borrow::Cow;

fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The normalized form of a request's `:path` (see the module doc). Borrows when the path is
/// already normal, which is the common case.
pub fn normalize(path: &str) -> Cow<'_, str> {
    let end = path.find(['?', '#']).unwrap_or(path.len());
    let p = path.get(..end).unwrap_or(path);
    let needs_work = !p.starts_with('/')
        || p.contains('%')
        || p.contains("//")
        || p.contains("/./")
        || p.contains("/../")
        || p.ends_with("/.")
        || p.ends_with("/..");
    if !needs_work {
        return Cow::Borrowed(p);
    }
    // Decode unreserved escapes first: `%2e%2e` is a dot segment too.
    let b = p.as_bytes();
    let mut decoded = Vec::with_capacity(b.len());
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        if c == b'%' {
            let v = b
                .get(i + 1)
                .and_then(|h| hex(*h))
                .zip(b.get(i + 2).and_then(|l| hex(*l)))
                .map(|(h, l)| h * 16 + l);
            if let Some(v) = v.filter(|v| unreserved(*v)) {
                decoded.push(v);
                i += 3;
                continue;
            }
        }
        decoded.push(c);
        i += 1;
    }
    let decoded = String::from_utf8_lossy(&decoded).into_owned();
    let mut segs: Vec<&str> = Vec::new();
    let mut trailing = false;
    for seg in decoded.split('/') {
        trailing = false;
        match seg {
            "" => trailing = true,
            "." => trailing = true,
            ".." => {
                segs.pop();
                trailing = true;
            }
            s => segs.push(s),
        }
    }
    let mut out = String::with_capacity(decoded.len());
    for s in &segs {
        out.push('/');
        out.push_str(s);
    }
    if trailing || segs.is_empty() {
        out.push('/');
    }
    Cow::Owned(out)
}

/// A matcher from `mcp_paths`, itself normalized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMatch {
    /// Matches this path, or it with one trailing slash. Stored without a trailing slash
    /// (except the root).
    Exact(String),
    Prefix(String),
}

impl PathMatch {
    /// From a configured entry: a trailing `*` makes a prefix.
    pub fn parse(configured: &str) -> PathMatch {
        match configured.strip_suffix('*') {
            Some(prefix) => PathMatch::Prefix(normalize(prefix).into_owned()),
            None => {
                let n = normalize(configured);
                let trimmed = match n.strip_suffix('/') {
                    Some(t) if !t.is_empty() => t,
                    _ => &n,
                };
                PathMatch::Exact(trimmed.to_owned())
            }
        }
    }

    /// Does this normalized path match?
    pub fn matches(&self, normalized: &str) -> bool {
        match self {
            PathMatch::Exact(p) => {
                normalized == p
                    || normalized
                        .strip_prefix(p.as_str())
                        .is_some_and(|rest| rest == "/")
            }
            PathMatch::Prefix(p) => normalized.starts_with(p.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_of_one_path_normalize_alike() {
        for p in [
            "/mcp",
            "/mcp?x=1",
            "//mcp",
            "/a/../mcp",
            "/./mcp",
            "/%6dcp",
            "/%6Dcp#f",
            "/x/%2e%2e/mcp",
            "/../../mcp",
        ] {
            assert_eq!(normalize(p), "/mcp", "{p}");
        }
        assert_eq!(normalize("/mcp/"), "/mcp/");
        assert_eq!(normalize("/mcp/."), "/mcp/");
        assert_eq!(normalize("/mcp//"), "/mcp/");
        assert_eq!(normalize("/mcp%2F"), "/mcp%2F");
        assert_eq!(normalize("/"), "/");
        assert_eq!(normalize("/.."), "/");
        assert!(matches!(normalize("/mcp?q"), Cow::Borrowed(_)));
    }

    #[test]
    fn exact_paths_match_with_one_trailing_slash() {
        let m = PathMatch::parse("/mcp");
        assert_eq!(PathMatch::parse("/mcp/"), m);
        let is = |p: &str| m.matches(&normalize(p));
        assert!(is("/mcp") && is("/mcp/") && is("//mcp//") && is("/mcp/."));
        assert!(!is("/mcpx") && !is("/mcp/x") && !is("/") && !is("/mcp%2F"));
        let pre = PathMatch::parse("/tenants/*");
        assert!(pre.matches(&normalize("/tenants/a/mcp")));
        assert!(pre.matches(&normalize("//tenants//a")));
        assert!(!pre.matches(&normalize("/tenantsx")));
        assert!(PathMatch::parse("/").matches("/"));
    }
}
