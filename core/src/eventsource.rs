//! The client model: what a client's EventSource parser dispatches from an event stream.
//!
//! A host-free, incremental implementation of the WHATWG "interpreting an event stream" rules
//! (<https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation>).
//! The guard's promises are judged against it: every event the client application dispatches
//! must be the next event of its stream. It is a model, not a filter: it holds one line at a
//! time and the current block's data, unbounded (bound the input when fuzzing).
//!
//! Rules, in order:
//! - The stream is UTF-8 decoded with replacement (maximal subparts, as WHATWG's decoder);
//!   one leading BOM is stripped. Line terminators are ASCII, so each line is decoded alone.
//! - Lines end at CRLF, LF or CR; a CR ending one chunk and an LF starting the next are one end.
//! - A line starting with `:` is a comment. Otherwise the field name is up to the first `:`
//!   (the whole line when there is none, with an empty value); one leading space is stripped
//!   from the value.
//! - `data` appends value + LF; `event` sets the type; `id` sets the last-event-id buffer unless
//!   the value contains NUL (an empty value resets it); `retry` only when all ASCII digits.
//! - A blank line dispatches: the client's last event id becomes the buffer (so an id-only
//!   block still moves it); an empty data buffer then dispatches nothing; otherwise one trailing
//!   LF is removed and the event is dispatched. Data and type reset, the id buffer stays.
//! - At the end of the stream an incomplete block is discarded, its `id` included: the last
//!   event id only changes at a blank line.

/// One event as a client application receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispatch {
    /// The `event` field, "" when none (clients treat "" as "message").
    pub event: String,
    /// Data lines joined with "\n" (trailing LF removed, per WHATWG).
    pub data: String,
    /// The client's last event id when this event is dispatched.
    pub last_event_id: String,
}

/// An incremental event-stream parser, fed bytes split anywhere.
#[derive(Debug, Default, Clone)]
pub struct Parser {
    /// Bytes of a line that spans chunks (empty while lines fit in a chunk).
    line: Vec<u8>,
    /// The previous chunk ended in CR: an LF starting the next chunk ends no line.
    after_cr: bool,
    /// The first line was seen (its leading BOM, if any, stripped).
    started: bool,
    data: String,
    event: String,
    id_buffer: String,
    last_event_id: String,
    retry: Option<u64>,
}

impl Parser {
    pub fn new() -> Parser {
        Parser::default()
    }

    /// Feed bytes split anywhere; appends each dispatched event to `out`.
    pub fn feed(&mut self, mut chunk: &[u8], out: &mut Vec<Dispatch>) {
        if self.after_cr && !chunk.is_empty() {
            self.after_cr = false;
            if chunk[0] == b'\n' {
                chunk = &chunk[1..];
            }
        }
        while let Some(pos) = memchr::memchr2(b'\r', b'\n', chunk) {
            if self.line.is_empty() {
                self.line_end(&chunk[..pos], out);
            } else {
                // Taken out and put back, so the buffer's allocation is reused.
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(&chunk[..pos]);
                self.line_end(&line, out);
                line.clear();
                self.line = line;
            }
            let mut next = pos + 1;
            if chunk[pos] == b'\r' {
                match chunk.get(next) {
                    Some(b'\n') => next += 1,
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            chunk = &chunk[next..];
        }
        self.line.extend_from_slice(chunk);
    }

    /// The client's last event id now (set by a block's `id` even when the block dispatches nothing).
    pub fn last_event_id(&self) -> &str {
        &self.last_event_id
    }

    /// Bytes held for the block being read (its line so far, data, type and id): what a
    /// bounded user checks.
    pub fn held_bytes(&self) -> usize {
        self.line.len() + self.data.len() + self.event.len() + self.id_buffer.len()
    }

    /// The last valid `retry:` (all digits), if any.
    pub fn retry(&self) -> Option<u64> {
        self.retry
    }

    fn line_end(&mut self, raw: &[u8], out: &mut Vec<Dispatch>) {
        // Borrows `raw` unless the line holds invalid UTF-8.
        let decoded = String::from_utf8_lossy(raw);
        let mut line: &str = &decoded;
        if !self.started {
            self.started = true;
            line = line.strip_prefix('\u{FEFF}').unwrap_or(line);
        }
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "data" => {
                self.data.push_str(value);
                self.data.push('\n');
            }
            "event" => set(&mut self.event, value),
            "id" if !value.contains('\0') => set(&mut self.id_buffer, value),
            "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                // Digits beyond u64 are a reconnection time no client waits for: ignored.
                if let Ok(ms) = value.parse() {
                    self.retry = Some(ms);
                }
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<Dispatch>) {
        self.last_event_id.clone_from(&self.id_buffer);
        if self.data.is_empty() {
            self.event.clear();
            return;
        }
        self.data.pop();
        out.push(Dispatch {
            event: std::mem::take(&mut self.event),
            data: std::mem::take(&mut self.data),
            last_event_id: self.last_event_id.clone(),
        });
    }
}

fn set(buffer: &mut String, value: &str) {
    buffer.clear();
    buffer.push_str(value);
}

/// Convenience: the whole stream, in the given chunks; returns dispatched events and the final last event id.
pub fn parse(chunks: &[&[u8]]) -> (Vec<Dispatch>, String) {
    let mut parser = Parser::new();
    let mut out = Vec::new();
    for chunk in chunks {
        parser.feed(chunk, &mut out);
    }
    (out, parser.last_event_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(event: &str, data: &str, id: &str) -> Dispatch {
        Dispatch {
            event: event.into(),
            data: data.into(),
            last_event_id: id.into(),
        }
    }

    fn one(stream: &[u8]) -> (Vec<Dispatch>, String) {
        parse(&[stream])
    }

    /// The stream split at every offset, and byte by byte, reads as it does whole.
    fn split_invariant(stream: &[u8]) -> (Vec<Dispatch>, String) {
        let whole = one(stream);
        for at in 0..=stream.len() {
            assert_eq!(
                parse(&[&stream[..at], &stream[at..]]),
                whole,
                "split at {at}"
            );
        }
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(parse(&bytes), whole, "byte by byte");
        whole
    }

    #[test]
    fn data_lines_join_with_lf_and_the_trailing_lf_goes() {
        let (evs, id) = split_invariant(b"data: a\ndata: b\n\n");
        assert_eq!(evs, vec![ev("", "a\nb", "")]);
        assert_eq!(id, "");
    }

    #[test]
    fn line_ends_crlf_lf_and_cr_each_end_one_line() {
        let want = vec![ev("", "a", ""), ev("", "b", ""), ev("", "c", "")];
        assert_eq!(
            split_invariant(b"data: a\r\n\r\ndata: b\n\ndata: c\r\r").0,
            want
        );
        // CR then LF is one line end, LF then CR two.
        assert_eq!(
            split_invariant(b"data: a\r\ndata: b\r\n\r\n").0,
            vec![ev("", "a\nb", "")]
        );
        assert_eq!(
            split_invariant(b"data: a\n\rdata: b\n\n").0,
            vec![ev("", "a", ""), ev("", "b", "")]
        );
    }

    #[test]
    fn cr_at_a_chunk_end_and_lf_after_it_are_one_line_end() {
        let (evs, _) = parse(&[b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]);
        assert_eq!(evs, vec![ev("", "a\nb", "")]);
        // An empty chunk in between changes nothing.
        let (evs, _) = parse(&[b"data: a\r", b"", b"\ndata: b\n\n"]);
        assert_eq!(evs, vec![ev("", "a\nb", "")]);
        // A CR at a chunk end not followed by LF still ends its line.
        let (evs, _) = parse(&[b"data: a\r", b"\r"]);
        assert_eq!(evs, vec![ev("", "a", "")]);
    }

    #[test]
    fn one_leading_bom_is_stripped_not_two_and_not_later() {
        assert_eq!(
            split_invariant(b"\xEF\xBB\xBFdata: a\n\n").0,
            vec![ev("", "a", "")]
        );
        // The second BOM is part of the field name "\u{FEFF}data": ignored.
        assert_eq!(
            split_invariant(b"\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\n").0,
            vec![]
        );
        assert_eq!(
            split_invariant(b"data: a\n\n\xEF\xBB\xBFdata: b\n\n").0,
            vec![ev("", "a", "")]
        );
        // A BOM alone on the first line leaves it blank.
        assert_eq!(
            split_invariant(b"\xEF\xBB\xBF\ndata: a\n\n").0,
            vec![ev("", "a", "")]
        );
    }

    #[test]
    fn invalid_utf8_is_replaced_and_split_code_points_join() {
        let (evs, _) = split_invariant("data: \u{1F600}é\n\n".as_bytes());
        assert_eq!(evs, vec![ev("", "\u{1F600}é", "")]);
        let (evs, _) = split_invariant(b"data: a\xFFb\xF0\x9F\n\n");
        assert_eq!(evs, vec![ev("", "a\u{FFFD}b\u{FFFD}", "")]);
        // A truncated sequence before a CR is one replacement, the CR still a line end.
        let (evs, _) = split_invariant(b"data: \xE2\x82\rdata: x\r\r");
        assert_eq!(evs, vec![ev("", "\u{FFFD}\nx", "")]);
    }

    #[test]
    fn field_splits_at_the_first_colon_and_loses_one_space() {
        let (evs, _) = split_invariant(b"data:a:b\ndata:  c\ndata\ndata:\n\n");
        assert_eq!(evs, vec![ev("", "a:b\n c\n\n", "")]);
        // Field names are exact: case and spaces matter.
        assert_eq!(
            split_invariant(b"Data: a\ndata : b\n data: c\n\n").0,
            vec![]
        );
    }

    #[test]
    fn comments_are_ignored() {
        let (evs, id) = split_invariant(b": hi\n:id: 9\ndata: a\n: more\n\n");
        assert_eq!(evs, vec![ev("", "a", "")]);
        assert_eq!(id, "");
    }

    #[test]
    fn event_sets_the_type_for_one_dispatch() {
        let (evs, _) = split_invariant(b"event: x\nevent: y\ndata: a\n\ndata: b\n\n");
        assert_eq!(evs, vec![ev("y", "a", ""), ev("", "b", "")]);
        // A type without data is dropped with its block.
        assert_eq!(
            split_invariant(b"event: x\n\ndata: b\n\n").0,
            vec![ev("", "b", "")]
        );
    }

    #[test]
    fn id_persists_and_an_empty_id_resets_it() {
        let (evs, id) = split_invariant(b"id: 1\ndata: a\n\ndata: b\n\nid\ndata: c\n\n");
        assert_eq!(
            evs,
            vec![ev("", "a", "1"), ev("", "b", "1"), ev("", "c", "")]
        );
        assert_eq!(id, "");
        let (_, id) = split_invariant(b"id: 1\ndata: a\n\nid:\n\n");
        assert_eq!(id, "");
        // The value keeps everything after the one stripped space.
        assert_eq!(split_invariant(b"id:  2 \n\n").1, " 2 ");
    }

    #[test]
    fn id_with_nul_is_ignored() {
        let (evs, id) = split_invariant(b"id: 1\n\nid: 2\0x\ndata: a\n\n");
        assert_eq!(evs, vec![ev("", "a", "1")]);
        assert_eq!(id, "1");
    }

    #[test]
    fn id_only_block_moves_the_last_event_id_without_dispatching() {
        let (evs, id) = split_invariant(b"id: 1\ndata: a\n\nid: 2\n\n");
        assert_eq!(evs, vec![ev("", "a", "1")]);
        assert_eq!(id, "2");
        let mut parser = Parser::new();
        let mut out = Vec::new();
        parser.feed(b"id: 7\n", &mut out);
        assert_eq!(parser.last_event_id(), "");
        parser.feed(b"\n", &mut out);
        assert_eq!((out.len(), parser.last_event_id()), (0, "7"));
    }

    #[test]
    fn empty_data_field_still_dispatches() {
        let (evs, _) = split_invariant(b"data:\n\ndata\n\n");
        assert_eq!(evs, vec![ev("", "", ""), ev("", "", "")]);
    }

    #[test]
    fn retry_only_when_all_ascii_digits() {
        let cases: [(&[u8], Option<u64>); 7] = [
            (b"retry: 1500\n", Some(1500)),
            (b"retry: 10\nretry: 1x\n", Some(10)),
            (b"retry: -1\n", None),
            (b"retry:\n", None),
            (b"retry: 1 \n", None),
            (b"retry: \xD9\xA1\n", None), // ARABIC-INDIC DIGIT ONE is no ASCII digit
            (b"retry: 99999999999999999999999\n", None),
        ];
        for (stream, want) in cases {
            let mut parser = Parser::new();
            parser.feed(stream, &mut Vec::new());
            assert_eq!(
                parser.retry(),
                want,
                "{:?}",
                String::from_utf8_lossy(stream)
            );
        }
    }

    #[test]
    fn unknown_fields_change_nothing() {
        let (evs, id) = split_invariant(b"foo: 1\nid: 3\nbar\ndata: a\n\n");
        assert_eq!(evs, vec![ev("", "a", "3")]);
        assert_eq!(id, "3");
    }

    #[test]
    fn an_incomplete_block_at_the_end_is_discarded_with_its_id() {
        let (evs, id) = split_invariant(b"id: 1\ndata: a\n\nid: 2\ndata: b\n");
        assert_eq!(evs, vec![ev("", "a", "1")]);
        assert_eq!(id, "1");
        assert_eq!(split_invariant(b"data: a").0, vec![]);
    }

    #[test]
    fn long_lines_across_many_chunks() {
        let payload = "x".repeat(100_000);
        let stream = format!("id: {payload}\ndata: {payload}\n\n");
        let chunks: Vec<&[u8]> = stream.as_bytes().chunks(977).collect();
        let (evs, id) = parse(&chunks);
        assert_eq!(evs, vec![ev("", &payload, &payload)]);
        assert_eq!(id, payload);
    }
}
