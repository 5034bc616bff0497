//! `mcp-guard`: the operator CLI of mcp-resume-guard.
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use base64::Engine as _;
use clap::{Args, Parser, Subcommand};
use mcp_resume_core::config::Config;
use mcp_resume_core::cursor::{incarnation_hex, session_key};
use mcp_resume_core::ownership::{
    BranchQuery, ResumeQuery, ResumeVerdict, BRANCH_PATH, RESUME_PATH,
};
use serde_json::{json, Value};

mod check;
mod cursor;
mod source;

#[derive(Parser)]
#[command(
    name = "mcp-guard",
    version,
    about = "Operator CLI of mcp-resume-guard: keys, config checks, cursors, ownership service"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print a new cursor key entry: an id and the base64 of 32 random bytes.
    Keygen(KeygenArgs),
    /// Validate a plugin config exactly as the filter does, and the proxy config around it.
    ///
    /// Accepts the plugin JSON, an Envoy YAML/JSON that embeds it, Istio objects (WasmPlugin,
    /// EnvoyFilter, VirtualService) or Envoy Gateway objects (EnvoyExtensionPolicy,
    /// EnvoyPatchPolicy, HTTPRoute, BackendTrafficPolicy). Files given together are checked
    /// together. Exits 1 when anything is wrong; every message starts with the field at fault.
    CheckConfig(CheckArgs),
    /// Verify and decode a cursor (an SSE event id the guard minted) with a config's keys.
    ///
    /// Prints version, key id, session binding, incarnation, kind, seq and the replica's own
    /// event id, or why the guard refuses the cursor. Exits 1 when it would be refused locally.
    InspectCursor(InspectArgs),
    /// Ask an ownership service what it would decide for a cursor (POST /v1/resume).
    ///
    /// Exits 0 whatever the verdict; 1 when the cursor is refused before any callout or the
    /// service does not answer with a verdict.
    Verdict(VerdictArgs),
    /// Mark a replica address gone (the preStop call, POST /v1/owners/gone): every stream it
    /// owned restarts at once. Uses the admin token.
    MarkGone(MarkGoneArgs),
}

#[derive(Args)]
struct KeygenArgs {
    /// Key id, 0-255. Default: one more than the highest id in --config, or 1.
    #[arg(long)]
    id: Option<u8>,
    /// Mark the key active (signs new cursors). Roll it out inactive first when several
    /// Envoys share the keys.
    #[arg(long)]
    active: bool,
    /// A config whose keys the new id must not collide with.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print only the secret (base64), for a Secret or an env file:
    /// `kubectl create secret generic ... --from-literal=key-1="$(mcp-guard keygen --secret)"`.
    #[arg(long, conflicts_with_all = ["id", "active", "config"])]
    secret: bool,
}

#[derive(Args)]
struct CheckArgs {
    /// Configuration files (JSON or YAML, several documents allowed).
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct InspectArgs {
    /// Config holding the keys (any format check-config accepts).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// The request's Mcp-Session-Id: also checks the cursor's session binding.
    #[arg(long, value_name = "ID")]
    session: Option<String>,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
    /// The cursor (Last-Event-ID value).
    cursor: String,
}

#[derive(Args)]
struct ServiceArgs {
    /// Base URL of an ownership service instance.
    #[arg(
        long,
        env = "MCP_OWNERSHIP_URL",
        default_value = "http://127.0.0.1:9200"
    )]
    url: String,
    /// Request timeout in milliseconds.
    #[arg(long, default_value_t = 3000)]
    timeout_ms: u64,
}

#[derive(Args)]
struct VerdictArgs {
    #[command(flatten)]
    service: ServiceArgs,
    /// File holding the service's bearer token (sent as `Authorization: Bearer ...`).
    #[arg(long, env = "MCP_OWNERSHIP_TOKEN_FILE", value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Config holding the keys (any format check-config accepts).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// The Mcp-Session-Id the cursor belongs to.
    #[arg(long, value_name = "ID")]
    session: String,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
    /// The cursor (Last-Event-ID value).
    cursor: String,
}

#[derive(Args)]
struct MarkGoneArgs {
    #[command(flatten)]
    service: ServiceArgs,
    /// File holding the service's admin bearer token.
    #[arg(long, env = "MCP_OWNERSHIP_ADMIN_TOKEN_FILE", value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// The replica address exactly as Envoy reports upstream.address: POD_IP:PORT.
    owner: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Keygen(a) => keygen(a),
        Cmd::CheckConfig(a) => check_config(a),
        Cmd::InspectCursor(a) => inspect_cursor(a),
        Cmd::Verdict(a) => verdict(a),
        Cmd::MarkGone(a) => mark_gone(a),
    };
    match res {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mcp-guard: {e}");
            ExitCode::from(1)
        }
    }
}

type Res = Result<ExitCode, String>;

fn keygen(a: KeygenArgs) -> Res {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| format!("no randomness from the OS: {e}"))?;
    // The guard refuses keys that do not look random; a draw that does not (p < 1e-13) is
    // drawn again rather than printed.
    while mcp_resume_core::config::check_random(&secret).is_err() {
        getrandom::fill(&mut secret).map_err(|e| format!("no randomness from the OS: {e}"))?;
    }
    if a.secret {
        println!(
            "{}",
            base64::engine::general_purpose::STANDARD.encode(secret)
        );
        return Ok(ExitCode::SUCCESS);
    }
    let id = match (a.id, &a.config) {
        (Some(id), _) => id,
        (None, Some(path)) => {
            let c = load_config(path, false)?;
            let max = c.keyring.key_ids().max().unwrap_or(0);
            max.checked_add(1)
                .ok_or("every key id up to 255 is taken; pass --id")?
        }
        (None, None) => 1,
    };
    if let Some(path) = &a.config {
        let c = load_config(path, false)?;
        if c.keyring.key_ids().any(|k| k == id) {
            return Err(format!("key id {id} is already in {}", path.display()));
        }
    }
    let entry = json!({
        "id": id,
        "active": a.active,
        "secret": base64::engine::general_purpose::STANDARD.encode(secret),
    });
    println!("{entry}");
    Ok(ExitCode::SUCCESS)
}

fn load_docs(files: &[PathBuf]) -> Result<Vec<source::Doc>, String> {
    let mut docs = Vec::new();
    for f in files {
        docs.extend(source::load(f)?);
    }
    Ok(docs)
}

/// The one valid plugin config in a file, for commands that need its keys.
/// `real_env`: read `secret_env` from this shell (the keys themselves are needed), else only
/// the ids are.
fn load_config(path: &Path, real_env: bool) -> Result<Config, String> {
    let docs = source::load(path)?;
    let mut r = check::check_with(&docs, real_env);
    if let Some(e) = r.errors.iter().find(|e| e.contains("invalid config")) {
        return Err(format!("{}: {e}", path.display()));
    }
    match r.configs.len() {
        0 => Err(format!(
            "{}: no valid plugin configuration found ({})",
            path.display(),
            r.errors.join("; ")
        )),
        1 => Ok(r.configs.remove(0).1),
        n => Err(format!(
            "{}: {n} plugin configurations found; give a file with one",
            path.display()
        )),
    }
}

fn check_config(a: CheckArgs) -> Res {
    let docs = load_docs(&a.files)?;
    let r = check::check(&docs);
    let files: Vec<String> = a.files.iter().map(|f| f.display().to_string()).collect();
    if a.json {
        let v = json!({
            "ok": r.errors.is_empty(),
            "files": files,
            "errors": r.errors,
            "warnings": r.warnings,
            "notes": r.notes,
            "plugin_configs": r.configs.iter().map(|(at, _)| at.clone()).collect::<Vec<_>>(),
        });
        println!("{v:#}");
    } else {
        for e in &r.errors {
            println!("error: {e}");
        }
        for w in &r.warnings {
            println!("warning: {w}");
        }
        for n in &r.notes {
            println!("note: {n}");
        }
        if r.errors.is_empty() {
            println!(
                "ok: {} ({} plugin configuration{} valid)",
                files.join(", "),
                r.configs.len(),
                if r.configs.len() == 1 { "" } else { "s" }
            );
        }
    }
    Ok(if r.errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn inspect_cursor(a: InspectArgs) -> Res {
    let config = load_config(&a.config, true)?;
    let (ok, v) = cursor::inspect(&config, &a.cursor, a.session.as_deref());
    if a.json {
        println!("{v:#}");
    } else {
        print!("{}", cursor::render(&v));
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn read_token(file: Option<&Path>) -> Result<Option<String>, String> {
    let Some(f) = file else { return Ok(None) };
    let t = std::fs::read_to_string(f).map_err(|e| format!("--token-file {}: {e}", f.display()))?;
    let t = t.trim().to_string();
    if t.is_empty() {
        return Err(format!("--token-file {}: empty", f.display()));
    }
    Ok(Some(t))
}

/// POST JSON; returns the status and the body as text.
fn post(
    s: &ServiceArgs,
    path: &str,
    token: Option<&str>,
    body: &Value,
) -> Result<(u16, String), String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_millis(s.timeout_ms)))
        .build()
        .into();
    let url = format!("{}{path}", s.url.trim_end_matches('/'));
    let mut req = agent.post(&url).header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", &format!("Bearer {t}"));
    }
    let mut resp = req
        .send(body.to_string().as_bytes())
        .map_err(|e| format!("POST {url}: {e}"))?;
    let status = resp.status().as_u16();
    let text = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| format!("POST {url}: reading the answer: {e}"))?;
    Ok((status, text))
}

fn verdict(a: VerdictArgs) -> Res {
    let config = load_config(&a.config, true)?;
    let (ok, v) = cursor::inspect(&config, &a.cursor, Some(&a.session));
    if !ok {
        print!("{}", cursor::render(&v));
        println!("(refused by the guard itself: no callout would be made)");
        return Ok(ExitCode::from(1));
    }
    let d = config
        .keyring
        .decode(a.cursor.trim())
        .map_err(|e| format!("cursor: {e}"))?;
    let query = ResumeQuery {
        session: session_key(a.session.as_bytes()),
        incarnation: incarnation_hex(d.incarnation),
        kind: d.kind,
        seq: d.seq,
        registration: None,
    };
    let body = serde_json::to_value(&query).map_err(|e| e.to_string())?;
    let token =
        read_token(a.token_file.as_deref())?.or_else(|| std::env::var("MCP_OWNERSHIP_TOKEN").ok());
    let (status, text) = post(&a.service, RESUME_PATH, token.as_deref(), &body)?;
    let parsed: Option<ResumeVerdict> = if status == 200 {
        serde_json::from_str(&text).ok()
    } else {
        None
    };
    // A `continue` opened a branch of the stream in the store; this probe never relays, so it
    // ends the branch at once (a branch left open would make the next clean end read `forked`).
    if let Some(ResumeVerdict::Continue {
        branch: Some(b), ..
    }) = &parsed
    {
        let end = BranchQuery {
            session: query.session.clone(),
            incarnation: query.incarnation.clone(),
            branch: *b,
        };
        let end = serde_json::to_value(&end).map_err(|e| e.to_string())?;
        let (status, text) = post(&a.service, BRANCH_PATH, token.as_deref(), &end)?;
        if status != 200 {
            eprintln!(
                "warning: could not end the probe's branch {b}: HTTP {status}: {}",
                text.trim()
            );
        }
    }
    let Some(verdict) = parsed else {
        // The guard fails closed on exactly this: ownership_unavailable.
        println!(
            "no verdict: HTTP {status}: {}\n(the guard would refuse the cursor: ownership_unavailable)",
            text.trim()
        );
        return Ok(ExitCode::from(1));
    };
    if a.json {
        let out = json!({"query": body, "verdict": serde_json::to_value(&verdict).map_err(|e| e.to_string())?});
        println!("{out:#}");
        return Ok(ExitCode::SUCCESS);
    }
    match verdict {
        ResumeVerdict::Continue {
            owner,
            expected,
            head,
            resume_id,
            ..
        } => println!(
            "continue: owner {owner}, head seq {head}, {} recorded event(s) to replay after seq {}{}",
            expected.len(),
            query.seq,
            if resume_id.is_some() {
                " (the replica's long id comes from the store)"
            } else {
                ""
            }
        ),
        ResumeVerdict::NewStream { reason, .. } => println!(
            "new stream: reason={reason} (the client gets Mcp-Resume: restarted or rejected; \
             reason={reason})"
        ),
    }
    Ok(ExitCode::SUCCESS)
}

fn mark_gone(a: MarkGoneArgs) -> Res {
    let token = read_token(a.token_file.as_deref())?
        .or_else(|| std::env::var("MCP_OWNERSHIP_ADMIN_TOKEN").ok());
    let (status, text) = post(
        &a.service,
        "/v1/owners/gone",
        token.as_deref(),
        &json!({ "owner": a.owner }),
    )?;
    if (200..300).contains(&status) {
        println!("{}", text.trim());
        Ok(ExitCode::SUCCESS)
    } else {
        Err(format!("HTTP {status}: {}", text.trim()))
    }
}
