//! TEMPORARY stand-in for `mcp_resume_core::eventsource` (branch `eventsource`, API in
//! /work/briefs/model-api.md): the WHATWG event-stream parser a client runs. Deleted once that
//! commit is cherry-picked.

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispatch {
    pub event: String,
    pub data: String,
    pub last_event_id: String,
}

#[derive(Debug, Default, Clone)]
pub struct Parser {
    line: Vec<u8>,
    after_cr: bool,
    started: bool,
    event: String,
    data: String,
    id_buffer: String,
    last_id: String,
    retry: Option<u64>,
}

impl Parser {
    pub fn new() -> Parser {
        Parser::default()
    }

    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<Dispatch>) {
        for &b in chunk {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\n' => self.end_line(out),
                b'\r' => {
                    self.after_cr = true;
                    self.end_line(out);
                }
                _ => self.line.push(b),
            }
        }
    }

    fn end_line(&mut self, out: &mut Vec<Dispatch>) {
        let mut line = std::mem::take(&mut self.line);
        if !self.started && line.starts_with("\u{feff}".as_bytes()) {
            line.drain(..3);
        }
        self.started = true;
        let text = String::from_utf8_lossy(&line).into_owned();
        if text.is_empty() {
            self.last_id = self.id_buffer.clone();
            if self.data.is_empty() {
                self.event.clear();
                return;
            }
            if self.data.ends_with('\n') {
                self.data.pop();
            }
            out.push(Dispatch {
                event: std::mem::take(&mut self.event),
                data: std::mem::take(&mut self.data),
                last_event_id: self.last_id.clone(),
            });
            return;
        }
        if text.starts_with(':') {
            return;
        }
        let (field, value) = match text.find(':') {
            Some(i) => {
                let v = &text[i + 1..];
                (&text[..i], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (text.as_str(), ""),
        };
        match field {
            "event" => self.event = value.to_owned(),
            "data" => {
                self.data.push_str(value);
                self.data.push('\n');
            }
            "id" if !value.contains('\0') => self.id_buffer = value.to_owned(),
            "retry" if !value.is_empty() && value.bytes().all(|c| c.is_ascii_digit()) => {
                self.retry = value.parse().ok();
            }
            _ => {}
        }
        self.line = line;
        self.line.clear();
    }

    pub fn last_event_id(&self) -> &str {
        &self.last_id
    }

    pub fn retry(&self) -> Option<u64> {
        self.retry
    }
}
