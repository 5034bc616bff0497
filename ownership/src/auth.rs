//! Bearer tokens: who may talk to the service.
//!
//! Two token files: the guard's (`--token-file`: records, resume, metrics) and the admin's
//! (`--admin-token-file`: `/v1/owners/gone` only, so the token every MCP server pod's preStop
//! hook holds cannot write records, and the guard's cannot mark owners gone). `/healthz` is
//! always open (kubelet probes carry no token).
//!
//! A file holds one token per line (blank lines and `#` comments skipped). It is re-read when
//! it changes (polled, and checked again before refusing a token), so rotation is: add the
//! new token next to the old one, move the callers to it, remove the old one. A file that
//! cannot be read or holds no token keeps the previous set (a half-written file must not lock
//! everybody out). Tokens are compared as SHA-256 digests in constant time, against every
//! token of the set.
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};

use crate::error::ApiError;

/// Path of the operator / preStop endpoint, the admin token's only door (not in the core: only
/// people and hooks call it).
pub const OWNERS_GONE_PATH: &str = "/v1/owners/gone";

/// Shorter tokens are refused when a file is loaded: they are guessable.
pub const MIN_TOKEN_BYTES: usize = 16;

/// What identifies a version of the file: a rename or a rewrite changes at least one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    #[cfg(unix)]
    inode: u64,
}

fn stamp(path: &Path) -> std::io::Result<Stamp> {
    let m = std::fs::metadata(path)?;
    Ok(Stamp {
        modified: m.modified().ok(),
        len: m.len(),
        #[cfg(unix)]
        inode: std::os::unix::fs::MetadataExt::ino(&m),
    })
}

struct Loaded {
    stamp: Option<Stamp>,
    digests: Vec<[u8; 32]>,
}

/// The tokens of one file, kept current.
pub struct TokenFile {
    path: PathBuf,
    /// The flag it came from, for messages.
    flag: &'static str,
    loaded: RwLock<Loaded>,
}

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

/// The tokens of a file's text; an error names the line, never its content.
pub fn parse_tokens(text: &str) -> Result<Vec<[u8; 32]>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if t.len() < MIN_TOKEN_BYTES || !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "line {}: a token is at least {MIN_TOKEN_BYTES} printable ASCII characters without spaces",
                n + 1
            ));
        }
        out.push(digest(t.as_bytes()));
    }
    if out.is_empty() {
        return Err("no token in the file".to_owned());
    }
    Ok(out)
}

/// A token file that cannot be used: the flag, the path and what is wrong (never a token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenFileError {
    pub flag: &'static str,
    pub path: PathBuf,
    pub problem: String,
}

impl std::fmt::Display for TokenFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.flag, self.path.display(), self.problem)
    }
}

impl std::error::Error for TokenFileError {}

impl TokenFile {
    /// Load `path` now; any problem is an error naming `flag` and the path (never a token).
    pub fn load(flag: &'static str, path: impl Into<PathBuf>) -> Result<Self, TokenFileError> {
        let path = path.into();
        let (stamp, digests) = match read(&path) {
            Ok(r) => r,
            Err(problem) => {
                return Err(TokenFileError {
                    flag,
                    path,
                    problem,
                })
            }
        };
        Ok(TokenFile {
            path,
            flag,
            loaded: RwLock::new(Loaded {
                stamp: Some(stamp),
                digests,
            }),
        })
    }

    /// Re-read the file if it changed. Returns whether the token set changed.
    pub fn refresh(&self) -> bool {
        let now = stamp(&self.path).ok();
        let same = {
            let l = self.loaded.read().unwrap_or_else(|p| p.into_inner());
            now.is_some() && l.stamp == now
        };
        if same {
            return false;
        }
        match read(&self.path) {
            Ok((stamp, digests)) => {
                let mut l = self.loaded.write().unwrap_or_else(|p| p.into_inner());
                let changed = l.digests != digests;
                *l = Loaded {
                    stamp: Some(stamp),
                    digests,
                };
                if changed {
                    eprintln!(
                        "mcp-ownership: {} {}: reloaded",
                        self.flag,
                        self.path.display()
                    );
                }
                changed
            }
            Err(e) => {
                let mut l = self.loaded.write().unwrap_or_else(|p| p.into_inner());
                // Log once per version of the problem, then keep the last good set.
                if l.stamp.is_some() {
                    eprintln!(
                        "mcp-ownership: {} {}: {e}; keeping the previous tokens",
                        self.flag,
                        self.path.display()
                    );
                }
                l.stamp = None;
                false
            }
        }
    }

    /// Constant time in the token and in which entry (if any) matches.
    fn matches(&self, presented: &[u8]) -> bool {
        let d = digest(presented);
        let l = self.loaded.read().unwrap_or_else(|p| p.into_inner());
        let mut any = Choice::from(0);
        for t in &l.digests {
            any |= t.ct_eq(&d);
        }
        any.into()
    }

    /// Does `presented` match a token of the file, as it is now?
    pub fn allows(&self, presented: &[u8]) -> bool {
        // A miss re-checks the file first: a token added a moment ago already works.
        self.matches(presented) || (self.refresh() && self.matches(presented))
    }
}

fn read(path: &Path) -> Result<(Stamp, Vec<[u8; 32]>), String> {
    let before = stamp(path).map_err(|e| e.to_string())?;
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    Ok((before, parse_tokens(&text)?))
}

/// Who may call what. Without a guard token file everything is open (a local demo).
#[derive(Clone, Default)]
pub struct Auth {
    pub guard: Option<Arc<TokenFile>>,
    pub admin: Option<Arc<TokenFile>>,
}

impl Auth {
    pub fn is_open(&self) -> bool {
        self.guard.is_none() && self.admin.is_none()
    }

    /// The token set a path needs: `Ok(None)` open, `Ok(Some)` that set, `Err` nobody.
    fn needs(&self, path: &str) -> Result<Option<&TokenFile>, ()> {
        if path == "/healthz" {
            return Ok(None);
        }
        if path == OWNERS_GONE_PATH {
            return match (&self.admin, &self.guard) {
                (Some(a), _) => Ok(Some(a)),
                // Guards are authenticated but no admin is configured: nobody marks owners gone.
                (None, Some(_)) => Err(()),
                (None, None) => Ok(None),
            };
        }
        Ok(self.guard.as_deref())
    }

    /// Re-read both files if they changed.
    pub fn refresh(&self) {
        for f in [&self.guard, &self.admin].into_iter().flatten() {
            f.refresh();
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header.
pub fn bearer(value: &[u8]) -> Option<&[u8]> {
    let s = std::str::from_utf8(value).ok()?;
    let (scheme, token) = s.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token.as_bytes())
}

fn unauthorized() -> Response {
    let mut resp = ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "missing or invalid bearer token",
    )
    .into_response();
    resp.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    resp
}

/// Runs before routing and before any body is read: a refused request changes nothing.
pub async fn require_token(State(auth): State<Auth>, req: Request, next: Next) -> Response {
    let allowed = match auth.needs(req.uri().path()) {
        Ok(None) => true,
        Ok(Some(file)) => req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| bearer(v.as_bytes()))
            .is_some_and(|t| file.allows(t)),
        Err(()) => false,
    };
    if allowed {
        next.run(req).await
    } else {
        unauthorized()
    }
}
