//! What a WHATWG EventSource client sees in a byte stream: an oracle written from the spec
//! (<https://html.spec.whatwg.org/multipage/server-sent-events.html>), independent of the
//! rewriter under test.

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: String,
    pub data: String,
    pub last_id: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    pub events: Vec<Event>,
    /// Every `id` field the client accepted, in order ("" is a reset).
    pub ids: Vec<String>,
    pub retries: Vec<u64>,
    /// The client's last event id after the stream; `None` when never set.
    pub last_id: Option<String>,
}

pub fn parse(bytes: &[u8]) -> Seen {
    let text = String::from_utf8_lossy(bytes);
    let mut rest: &str = text.strip_prefix('\u{FEFF}').unwrap_or(&text);
    let (mut data, mut kind) = (String::new(), String::new());
    let mut id_buf: Option<String> = None;
    let mut seen = Seen::default();
    // A final line without a line end is never processed.
    while let Some(p) = rest.find(['\r', '\n']) {
        let line = rest.get(..p).unwrap_or_default();
        let eol = if rest.get(p..).is_some_and(|r| r.starts_with("\r\n")) {
            2
        } else {
            1
        };
        rest = rest.get(p + eol..).unwrap_or_default();
        if line.is_empty() {
            seen.last_id.clone_from(&id_buf);
            if data.is_empty() {
                kind.clear();
                continue;
            }
            if data.ends_with('\n') {
                data.pop();
            }
            seen.events.push(Event {
                kind: if kind.is_empty() {
                    "message".into()
                } else {
                    std::mem::take(&mut kind)
                },
                data: std::mem::take(&mut data),
                last_id: seen.last_id.clone(),
            });
            continue;
        }
        if line.starts_with(':') {
            continue;
        }
        let (name, value) = match line.split_once(':') {
            Some((n, v)) => (n, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match name {
            "event" => kind = value.into(),
            "data" => {
                data.push_str(value);
                data.push('\n');
            }
            "id" if !value.contains('\0') => {
                id_buf = Some(value.into());
                seen.ids.push(value.into());
            }
            "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                seen.retries.push(value.parse().unwrap_or(u64::MAX));
            }
            _ => {}
        }
    }
    seen
}

/// Splits `s` at the given offsets (taken modulo its length, sorted): the chunks a host delivers.
pub fn split<'a>(s: &'a [u8], cuts: &[u16]) -> Vec<&'a [u8]> {
    let mut at: Vec<usize> = cuts
        .iter()
        .map(|&c| usize::from(c) % (s.len() + 1))
        .collect();
    at.sort_unstable();
    let mut parts = Vec::with_capacity(at.len() + 1);
    let mut prev = 0;
    for p in at.into_iter().chain([s.len()]) {
        parts.push(s.get(prev..p).unwrap_or_default());
        prev = p;
    }
    parts
}
