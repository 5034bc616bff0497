//! `rmcp-client`: rmcp's own Streamable HTTP client (3.11.0, reqwest backend) making one
//! `progress` tool call, for the interop e2e tests.
//!
//! `--cut-after N` drops the POST response stream of the tool call after its N-th SSE event,
//! as a broken connection would (the reqwest response is dropped and the stream yields an
//! error). rmcp's client then resumes by itself: GET with `Last-Event-ID` set to the last id
//! it saw. Everything the client saw is printed as one JSON object on stdout: the progress
//! values delivered to the handler, the result or the error, and for every HTTP stream the
//! `Last-Event-ID` it was opened with and the event ids it carried.

use std::{
    collections::HashMap,
    process::ExitCode,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures_util::{stream::BoxStream, StreamExt};
use http::{HeaderName, HeaderValue};
use rmcp::{
    model::{
        CallToolRequestParams, ClientJsonRpcMessage, ContentBlock, ProgressNotificationParam,
        ProtocolVersion,
    },
    service::NotificationContext,
    transport::{
        streamable_http_client::{
            SseError, StreamableHttpClient, StreamableHttpClientTransportConfig,
            StreamableHttpError, StreamableHttpPostResponse,
        },
        StreamableHttpClientTransport,
    },
    ClientHandler, RoleClient, ServiceExt,
};
use serde_json::{json, Value};
use sse_stream::Sse;

const USAGE: &str = "\
usage: rmcp-client --url URL [--steps N] [--step-ms MS] [--label TEXT] [--cut-after N]
                   [--protocol VERSION] [--timeout-ms MS] [--header NAME:VALUE]...
                   [--resume-delay-ms MS]

--resume-delay-ms holds the first resume (GET with Last-Event-ID) back; the cut is announced on
stderr as a line `rmcp-client: cut`, so a test can change the world in between.
";

struct Args {
    url: String,
    steps: u32,
    step_ms: u64,
    label: String,
    cut_after: Option<usize>,
    protocol: String,
    timeout_ms: u64,
    headers: HashMap<HeaderName, HeaderValue>,
    resume_delay_ms: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        url: String::new(),
        steps: 5,
        step_ms: 300,
        label: "rmcp-client".into(),
        cut_after: None,
        protocol: "2025-11-25".into(),
        timeout_ms: 15_000,
        headers: HashMap::new(),
        resume_delay_ms: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--url" => a.url = v,
            "--steps" => a.steps = u32::try_from(num(&v)?).map_err(|e| e.to_string())?,
            "--step-ms" => a.step_ms = num(&v)?,
            "--label" => a.label = v,
            "--cut-after" => a.cut_after = Some(num(&v)? as usize),
            "--protocol" => a.protocol = v,
            "--timeout-ms" => a.timeout_ms = num(&v)?,
            "--resume-delay-ms" => a.resume_delay_ms = num(&v)?,
            "--header" => {
                let (name, value) = v
                    .split_once(':')
                    .ok_or_else(|| format!("--header {v}: NAME:VALUE"))?;
                let name = HeaderName::try_from(name.trim()).map_err(|e| e.to_string())?;
                let value = HeaderValue::try_from(value.trim()).map_err(|e| e.to_string())?;
                a.headers.insert(name, value);
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if a.url.is_empty() {
        return Err("--url is required".into());
    }
    Ok(a)
}

/// One HTTP response stream as the client saw it.
#[derive(Default)]
struct Conn {
    method: &'static str,
    last_event_id: Option<String>,
    ids: Vec<String>,
    cut: bool,
    error: Option<String>,
}

#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<Conn>>>);

impl Log {
    fn open(&self, method: &'static str, last_event_id: Option<String>) -> usize {
        let mut v = self.0.lock().unwrap_or_else(|e| e.into_inner());
        v.push(Conn {
            method,
            last_event_id,
            ..Conn::default()
        });
        v.len() - 1
    }
    fn with(&self, i: usize, f: impl FnOnce(&mut Conn)) {
        let mut v = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = v.get_mut(i) {
            f(c);
        }
    }
    fn to_json(&self) -> Value {
        let v = self.0.lock().unwrap_or_else(|e| e.into_inner());
        Value::Array(
            v.iter()
                .map(|c| {
                    json!({"method": c.method, "last_event_id": c.last_event_id,
                           "ids": c.ids, "cut": c.cut, "error": c.error})
                })
                .collect(),
        )
    }
}

/// reqwest's rmcp client, plus a log of every stream and an optional cut of the first
/// `tools/call` response stream.
#[derive(Clone)]
struct CuttingClient {
    inner: reqwest::Client,
    log: Log,
    cut_after: Arc<Mutex<Option<usize>>>,
    resume_delay: Arc<Mutex<Option<Duration>>>,
}

type SseStream = BoxStream<'static, Result<Sse, SseError>>;

impl CuttingClient {
    fn logged(&self, conn: usize, stream: SseStream, cut_after: Option<usize>) -> SseStream {
        // Pass events and log their ids; after `cut_after` events yield an error and end,
        // dropping the response, which closes the connection.
        let log = self.log.clone();
        futures_util::stream::unfold((Some(stream), 0usize), move |(st, seen)| {
            let log = log.clone();
            async move {
                let mut inner = st?;
                if cut_after.is_some_and(|n| seen >= n) {
                    drop(inner);
                    log.with(conn, |c| c.cut = true);
                    eprintln!("rmcp-client: cut");
                    let err = SseError::Body("rmcp-client: simulated connection drop".into());
                    return Some((Err(err), (None, seen)));
                }
                let item = inner.next().await?;
                let mut seen = seen;
                if let Ok(sse) = &item {
                    if let Some(id) = &sse.id {
                        let id = id.clone();
                        log.with(conn, |c| c.ids.push(id));
                    }
                    seen += 1;
                }
                Some((item, (Some(inner), seen)))
            }
        })
        .boxed()
    }
}

impl StreamableHttpClient for CuttingClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let is_call = serde_json::to_value(&message)
            .ok()
            .and_then(|v| v.get("method").and_then(Value::as_str).map(str::to_owned))
            .is_some_and(|m| m == "tools/call");
        let resp = self
            .inner
            .post_message(uri, message, session_id, auth_header, custom_headers)
            .await?;
        match resp {
            StreamableHttpPostResponse::Sse(stream, sid) => {
                let cut = if is_call {
                    self.cut_after
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .take()
                } else {
                    None
                };
                let conn = self.log.open("POST", None);
                Ok(StreamableHttpPostResponse::Sse(
                    self.logged(conn, stream, cut),
                    sid,
                ))
            }
            other => Ok(other),
        }
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        self.inner
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<SseStream, StreamableHttpError<Self::Error>> {
        if last_event_id.is_some() {
            let delay = self
                .resume_delay
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            if let Some(delay) = delay {
                tokio::time::sleep(delay).await;
            }
        }
        let conn = self.log.open("GET", last_event_id.clone());
        match self
            .inner
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await
        {
            Ok(stream) => Ok(self.logged(conn, stream, None)),
            Err(e) => {
                let text = e.to_string();
                self.log.with(conn, |c| c.error = Some(text));
                Err(e)
            }
        }
    }
}

struct Handler {
    info: rmcp::model::ClientConfig,
    progress: Arc<Mutex<Vec<f64>>>,
}

impl ClientHandler for Handler {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(params.progress);
    }

    fn get_info(&self) -> rmcp::model::ClientConfig {
        self.info.clone()
    }
}

async fn run(
    a: &Args,
    log: Log,
    progress: Arc<Mutex<Vec<f64>>>,
    negotiated: Arc<Mutex<Option<String>>>,
) -> Result<String, String> {
    let version: ProtocolVersion =
        serde_json::from_value(json!(a.protocol)).map_err(|e| e.to_string())?;
    let client = CuttingClient {
        inner: reqwest::Client::new(),
        log,
        cut_after: Arc::new(Mutex::new(a.cut_after)),
        resume_delay: Arc::new(Mutex::new(
            (a.resume_delay_ms > 0).then(|| Duration::from_millis(a.resume_delay_ms)),
        )),
    };
    let transport = StreamableHttpClientTransport::with_client(
        client,
        StreamableHttpClientTransportConfig::with_uri(a.url.clone())
            .custom_headers(a.headers.clone()),
    );
    let handler = Handler {
        info: rmcp::model::ClientConfig::default().with_protocol_version(version),
        progress,
    };
    let service = handler
        .serve(transport)
        .await
        .map_err(|e| format!("initialize: {e}"))?;
    let version = service
        .peer()
        .peer_info()
        .map(|info| info.protocol_version.to_string());
    *negotiated.lock().unwrap_or_else(|e| e.into_inner()) = version;
    let mut args = serde_json::Map::new();
    args.insert("steps".into(), json!(a.steps));
    args.insert("step_ms".into(), json!(a.step_ms));
    args.insert("label".into(), json!(a.label));
    let result = service
        .call_tool(CallToolRequestParams::new("progress").with_arguments(args))
        .await
        .map_err(|e| format!("tools/call: {e}"));
    let _ = service.cancel().await;
    let result = result?;
    Ok(result
        .content
        .iter()
        .filter_map(|c| match c {
            ContentBlock::Text(t) => Some(t.text.clone()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n"))
}

#[tokio::main]
async fn main() -> ExitCode {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rmcp-client: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let log = Log::default();
    let progress = Arc::new(Mutex::new(Vec::new()));
    let negotiated = Arc::new(Mutex::new(None));
    let outcome = tokio::time::timeout(
        Duration::from_millis(a.timeout_ms),
        run(&a, log.clone(), progress.clone(), negotiated.clone()),
    )
    .await;
    let (result, error) = match outcome {
        Ok(Ok(text)) => (Some(text), None),
        Ok(Err(e)) => (None, Some(e)),
        Err(_) => (None, Some(format!("timeout after {} ms", a.timeout_ms))),
    };
    let progress = progress.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let negotiated = negotiated.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let out = json!({
        "negotiated": negotiated,
        "result": result,
        "error": error,
        "progress": progress,
        "streams": log.to_json(),
    });
    println!("{out}");
    ExitCode::SUCCESS
}
