//! Where `--store` points and who to be there: URL parsing (one endpoint or a Cluster's
//! seeds), credentials and TLS roots, checked without connecting.
use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterClientBuilder};

/// `--store` schemes of a Redis Cluster: plain and TLS.
pub const CLUSTER_SCHEME: &str = "redis-cluster://";
pub const CLUSTER_TLS_SCHEME: &str = "rediss-cluster://";

/// A secret string: never shown by `Debug`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Who to be on Redis (ACL user and password; AUTH) and whom to trust (TLS). These override
/// any user or password in the URL.
#[derive(Debug, Clone, Default)]
pub struct RedisAuth {
    pub username: Option<String>,
    pub password: Option<Secret>,
    /// PEM CA certificates for `rediss://`; `None`: the system's roots.
    pub ca_pem: Option<Vec<u8>>,
}

/// How to reach Redis and how long to wait for it.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Prepended to every key (a namespace; no `{` or `}`). Default `mrg:`.
    pub prefix: String,
    /// Upper bound on one store operation (snapshot, apply, health), connecting included.
    pub op_timeout: Duration,
    /// Upper bound on one connection attempt.
    pub connect_timeout: Duration,
    /// Upper bound on one sweep or stats call (they touch many sessions).
    pub bulk_timeout: Duration,
    /// Replicas that must hold a record before it is acknowledged (`WAIT`); 0: the primary's
    /// word is enough.
    pub wait_replicas: u32,
    /// Bytes of Redis memory (`used_memory`, per primary) above 90% of which new sessions are
    /// refused; `None`: 80% of the primary's `maxmemory`, or no budget when it has none.
    pub max_bytes: Option<u64>,
    pub auth: RedisAuth,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            prefix: "mrg:".to_owned(),
            op_timeout: Duration::from_millis(150),
            connect_timeout: Duration::from_millis(100),
            bulk_timeout: Duration::from_secs(2),
            wait_replicas: 0,
            max_bytes: None,
            auth: RedisAuth::default(),
        }
    }
}

/// Where `--store` points, parsed (made once per store: size does not matter).
#[allow(clippy::large_enum_variant)]
pub(super) enum Target {
    Single(redis::Client),
    Cluster(ClusterClient),
}

/// A Redis URL safe to print: any user and password replaced by `***`.
pub fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// Why a Redis store could not be set up. Every variant shows the URL only redacted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetupError {
    /// Not the expected shape (`want`), e.g. another scheme; `why` says more when known.
    Shape {
        want: &'static str,
        shown: String,
        why: Option<&'static str>,
    },
    /// The port is not a usable port (also where a mistyped `user:password` lands).
    BadPort { want: &'static str },
    /// The redis crate refused the URL.
    Unusable {
        shown: String,
        what: &'static str,
        kind: String,
    },
    /// The CA file could not be used.
    Ca { shown: String, kind: String },
    /// A CA file given for a URL without TLS.
    CaWithoutTls { shown: String, scheme: &'static str },
    /// `--redis-prefix` contains braces (they would break the Cluster hash tags).
    Prefix(String),
    /// The connection could not be prepared.
    Connection(String),
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetupError::Shape {
                want,
                shown,
                why: None,
            } => write!(f, "expected {want}, got {shown:?}"),
            SetupError::Shape {
                want,
                shown,
                why: Some(why),
            } => write!(f, "expected {want}, got {shown:?} ({why})"),
            SetupError::BadPort { want } => write!(f, "expected {want} (bad port)"),
            SetupError::Unusable { shown, what, kind } => {
                write!(f, "{shown:?}: not a usable {what} ({kind})")
            }
            SetupError::Ca { shown, kind } => {
                write!(f, "{shown:?}: the CA file is not usable ({kind})")
            }
            SetupError::CaWithoutTls { shown, scheme } => {
                write!(f, "{shown:?}: a CA file is only for {scheme}:// (TLS) URLs")
            }
            SetupError::Prefix(p) => write!(f, "key prefix {p:?} must not contain braces"),
            SetupError::Connection(e) => write!(f, "redis: {e}"),
        }
    }
}

impl std::error::Error for SetupError {}

/// Is this `--store` value a Redis Cluster (`redis-cluster://`, `rediss-cluster://`)?
pub fn is_cluster_url(url: &str) -> bool {
    url.starts_with(CLUSTER_SCHEME) || url.starts_with(CLUSTER_TLS_SCHEME)
}

/// Check a `--store` Redis URL (`redis://…`, `rediss://…`, `redis-cluster://…`,
/// `rediss-cluster://…`) without connecting. The error says what is wrong and never shows a
/// password.
pub fn parse_url(url: &str) -> Result<(), SetupError> {
    target(url, &RedisOptions::default()).map(|_| ())
}

pub(super) fn target(url: &str, opts: &RedisOptions) -> Result<Target, SetupError> {
    if is_cluster_url(url) {
        cluster_client(url, opts).map(Target::Cluster)
    } else {
        client(url, &opts.auth).map(Target::Single)
    }
}

/// `HOST:PORT` with a usable port (the port is optional: `default_port` ok).
fn check_hostport(hostport: &str, shown: &str, want: &'static str) -> Result<(), SetupError> {
    if hostport.is_empty() || hostport.starts_with(':') {
        return Err(SetupError::Shape {
            want,
            shown: shown.to_owned(),
            why: Some("no host"),
        });
    }
    if let Some((_, port)) = hostport.rsplit_once(':') {
        if !hostport.ends_with(']') && port.parse::<u16>().map_or(true, |p| p == 0) {
            // Not the port's text: without an '@', a mistyped `user:password` lands here.
            return Err(SetupError::BadPort { want });
        }
    }
    Ok(())
}

/// The client for `url` with `auth` applied (credentials, TLS roots).
pub fn client(url: &str, auth: &RedisAuth) -> Result<redis::Client, SetupError> {
    let shown = redacted(url);
    let rest = url
        .strip_prefix("redis://")
        .or_else(|| url.strip_prefix("rediss://"))
        .ok_or_else(|| SetupError::Shape {
            want: "redis://HOST:PORT or rediss://HOST:PORT",
            shown: shown.clone(),
            why: None,
        })?;
    let hostport = rest.rsplit('@').next().unwrap_or(rest);
    let hostport = hostport.split('/').next().unwrap_or(hostport);
    check_hostport(hostport, &shown, "redis://HOST:PORT")?;
    let bad = |e: redis::RedisError| SetupError::Unusable {
        shown: shown.clone(),
        what: "Redis URL",
        kind: format!("{:?}", e.kind()),
    };
    let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(bad)?;
    let mut settings = info.redis_settings().clone();
    if let Some(u) = &auth.username {
        settings = settings.set_username(u);
    }
    if let Some(p) = &auth.password {
        settings = settings.set_password(&p.0);
    }
    let info = info.set_redis_settings(settings);
    let tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
    match (&auth.ca_pem, tls) {
        (Some(pem), true) => redis::Client::build_with_tls(
            info,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.clone()),
            },
        )
        .map_err(|e| SetupError::Ca {
            shown: shown.clone(),
            kind: format!("{:?}", e.kind()),
        }),
        (Some(_), false) => Err(SetupError::CaWithoutTls {
            shown: shown.clone(),
            scheme: "rediss",
        }),
        (None, _) => redis::Client::open(info).map_err(bad),
    }
}

/// The Cluster client for `redis-cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…]` (or
/// `rediss-cluster://` for TLS): every listed node is a seed; the client learns the rest.
fn cluster_client(url: &str, opts: &RedisOptions) -> Result<ClusterClient, SetupError> {
    const WANT: &str = "redis-cluster://HOST:PORT[,HOST:PORT…]";
    let shown = redacted(url);
    let (scheme, rest) = match url.strip_prefix(CLUSTER_SCHEME) {
        Some(rest) => ("redis", rest),
        None => (
            "rediss",
            url.strip_prefix(CLUSTER_TLS_SCHEME)
                .ok_or_else(|| SetupError::Shape {
                    want: WANT,
                    shown: shown.clone(),
                    why: None,
                })?,
        ),
    };
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, rest),
    };
    if hosts.contains('/') {
        return Err(SetupError::Shape {
            want: WANT,
            shown,
            why: Some("a Cluster has no database number"),
        });
    }
    let mut nodes = Vec::new();
    for hostport in hosts.split(',') {
        check_hostport(hostport, &shown, WANT)?;
        let node = match userinfo {
            Some(u) => format!("{scheme}://{u}@{hostport}"),
            None => format!("{scheme}://{hostport}"),
        };
        let info = redis::IntoConnectionInfo::into_connection_info(node.as_str()).map_err(|e| {
            SetupError::Unusable {
                shown: shown.clone(),
                what: "Redis URL",
                kind: format!("{:?}", e.kind()),
            }
        })?;
        nodes.push(info);
    }
    let tls = scheme == "rediss";
    let mut b = ClusterClientBuilder::new(nodes)
        .connection_timeout(opts.connect_timeout)
        // Per attempt and in all (retries and redirects included): one store operation.
        .response_timeout(opts.op_timeout)
        // Redirects are retried at once; TRYAGAIN and CLUSTERDOWN after 5-50 ms, a few times
        // only: a longer failover is a fast 503, and the next operation tries again.
        .retries(5)
        .min_retry_wait(5)
        .max_retry_wait(50)
        .retry_wait_formula(5, 2);
    if let Some(u) = &opts.auth.username {
        b = b.username(u);
    }
    if let Some(p) = &opts.auth.password {
        b = b.password(&p.0);
    }
    match (&opts.auth.ca_pem, tls) {
        (Some(pem), true) => {
            b = b.certs(redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.clone()),
            });
        }
        (Some(_), false) => {
            return Err(SetupError::CaWithoutTls {
                shown,
                scheme: "rediss-cluster",
            })
        }
        (None, _) => {}
    }
    b.build().map_err(|e| SetupError::Unusable {
        shown,
        what: "Redis Cluster URL",
        kind: format!("{:?}", e.kind()),
    })
}

/// A TLS provider for rustls, installed once per process (rediss:// needs one).
pub(super) fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::parse_url;

    #[test]
    fn urls() {
        assert!(parse_url("redis://127.0.0.1:6390").is_ok());
        assert!(parse_url("redis://localhost").is_ok());
        assert!(parse_url("redis://127.0.0.1:6390/2").is_ok());
        for bad in [
            "127.0.0.1:6390",
            "redis://",
            "redis://:6390",
            "redis://host:notaport",
            "redis://host:0",
            "http://host:1",
        ] {
            let e = parse_url(bad).err().unwrap().to_string();
            assert!(
                e.contains("redis://HOST:PORT") || e.contains(bad),
                "{bad}: {e}"
            );
        }
    }
}
