use super::*;

/// A request body with `id` written as `raw` after `params`, as the TypeScript SDK writes it.
fn req(raw: &str) -> String {
    format!(
        r#"{{"method":"tools/call","params":{{"id":99,"arguments":{{"id":"x"}}}},"jsonrpc":"2.0","id":{raw}}}"#
    )
}

#[test]
fn finds_the_id_the_clients_parser_reads() {
    let big = "18446744073709551616";
    let cases: &[(&str, Option<&str>)] = &[
        (
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call"}"#,
            Some("7"),
        ),
        (&req("12"), Some("12")),
        (r#" { "id" : "abc-1" , "method":"x"}"#, Some(r#""abc-1""#)),
        (r#"{"method":"x","id":"a\"b\\"}"#, Some(r#""a\"b\\""#)),
        (r#"{"method":"x","id":-1.5e3}"#, Some("-1.5e3")),
        (
            r#"{"method":"x","params":["id",{"id":1}],"id":2}"#,
            Some("2"),
        ),
        // A big integer, written back as sent (a float in JS: the client stored the float).
        (&req(big), Some(big)),
        (&req("1e400"), Some("1e400")),
        // A lone surrogate: JSON.parse and Python's json accept it.
        (&req(r#""\ud800""#), Some(r#""\ud800""#)),
        (&req(r#""\u00e9\n""#), Some(r#""\u00e9\n""#)),
        // Escaped keys are the keys they decode to.
        (r#"{"method":"x","i\u0064":5}"#, Some("5")),
        (r#"{"\u006dethod":"x","id":5}"#, Some("5")),
        (r#"{"method":"x","i\u0064x":5}"#, None),
        // Duplicate keys: the last wins, as in every client's parser.
        (r#"{"method":"x","id":1,"id":2}"#, Some("2")),
        (r#"{"method":"x","i\u0064":5,"id":6}"#, Some("6")),
        (r#"{"method":"x","id":6,"i\u0064":5}"#, Some("5")),
        (r#"{"method":"x","id":1,"id":null}"#, None),
        (r#"{"method":"x","id":null,"id":"b"}"#, Some(r#""b""#)),
        // Not a request: no call is pending for it.
        (r#"{"method":"notifications/initialized"}"#, None),
        (r#"{"jsonrpc":"2.0","id":3,"result":{}}"#, None),
        (r#"{"method":"x","id":null}"#, None),
        (r#"{"method":"x","id":true}"#, None),
        (r#"{"method":"x","id":{"a":1}}"#, None),
        (r#"{"method":"x","id":[1]}"#, None),
        (r#"{"method":"x","id":01}"#, None),
        (r#"{"method":"x","id":1.}"#, None),
        (r#"{"method":"x","id":"a"#, None),
        // A batch: every request's id, in order; notifications and responses skipped.
        (
            r#"[{"method":"a","id":1},{"method":"n"},{"id":9,"result":{}},{"method":"b","id":"x","id":"y"},7,"s",[{"method":"c","id":5}]]"#,
            Some(r#"[1,"y"]"#),
        ),
        (r#"[{"method":"a","id":1}]"#, Some("[1]")),
        (r#"[{"method":"n"}]"#, None),
        ("[]", None),
        ("garbage", None),
        ("7", None),
        ("", None),
    ];
    for (body, want) in cases {
        assert_eq!(request_id(body.as_bytes()).as_deref(), *want, "{body}");
    }
}

#[test]
fn any_split_into_chunks_gives_the_same_ids() {
    let bodies = [
        (
            br#"{"method":"tools/call","params":{"name":"t","arguments":{"id":"no","s":"}\"{"}},"jsonrpc":"2.0","id":"req-42"}"#.as_slice(),
            r#""req-42""#,
        ),
        (
            br#"[{"i\u0064":1,"method":"a"},{"params":{"x":"\\"},"method":"b","id":18446744073709551616}]"#.as_slice(),
            "[1,18446744073709551616]",
        ),
    ];
    for (body, want) in bodies {
        for cut in 0..body.len() {
            let (a, b) = body.split_at(cut);
            let mut s = RequestIdScanner::new();
            s.push(a);
            s.push(b);
            assert_eq!(s.finish(), &Scan::Found(want.into()), "cut at {cut}");
        }
    }
    // The id is only settled at the end of the top-level value: a later duplicate may follow.
    let mut s = RequestIdScanner::new();
    s.push(br#"{"method":"x","id":123,"#);
    assert_eq!(s.result(), &Scan::Pending);
    assert_eq!(s.finish(), &Scan::None, "an unterminated object has no id");
}

#[test]
fn one_leading_bom_is_read_past_as_servers_parsers_do() {
    let body = br#"{"jsonrpc":"2.0","id":45,"method":"tools/call"}"#;
    let with = |head: &[u8], tail: &[u8]| [head, body.as_slice(), tail].concat();
    let bom = b"\xef\xbb\xbf";
    // Python's json.loads(bytes) and TextDecoder + JSON.parse take these: any split.
    for ok in [with(bom, b""), with(b"\xef\xbb\xbf \r\n", b" ")] {
        for cut in 0..ok.len() {
            let (a, b) = ok.split_at(cut);
            let mut s = RequestIdScanner::new();
            s.push(a);
            s.push(b);
            assert_eq!(
                s.finish(),
                &Scan::Found("45".into()),
                "cut at {cut}: {ok:?}"
            );
        }
    }
    // Anywhere else, or twice, or a part of one, it is not JSON: no id.
    for bad in [
        with(b" \xef\xbb\xbf", b""),
        with(b"\xef\xbb\xbf\xef\xbb\xbf", b""),
        with(b"\xef\xbb", b""),
        with(b"\xef", b""),
        with(b"\xbb\xbf", b""),
    ] {
        assert_eq!(request_id(&bad), None, "{bad:?}");
    }
    // Inside the value it is string content like any other.
    let inside = "{\"method\":\"x\",\"id\":\"\u{feff}a\"}";
    assert_eq!(
        request_id(inside.as_bytes()).as_deref(),
        Some("\"\u{feff}a\"")
    );
}

#[test]
fn long_ids_and_long_bodies_are_bounded() {
    let quoted = |n: usize| format!(r#""{}""#, "x".repeat(n - 2));
    let fits = quoted(MAX_REQUEST_IDS_BYTES);
    assert_eq!(request_id(req(&fits).as_bytes()), Some(fits.clone()));
    assert_eq!(
        request_id(req(&quoted(MAX_REQUEST_IDS_BYTES + 1)).as_bytes()),
        None
    );
    // A long id that a later duplicate replaces does not count.
    let replaced = format!(
        r#"{{"method":"x","id":{},"id":1}}"#,
        quoted(MAX_REQUEST_IDS_BYTES * 2)
    );
    assert_eq!(request_id(replaced.as_bytes()).as_deref(), Some("1"));
    // A batch whose ids together exceed the bound carries none (never a part of them).
    let half = quoted(MAX_REQUEST_IDS_BYTES / 2);
    let batch = format!(r#"[{{"method":"a","id":{half}}},{{"method":"b","id":{half}}}]"#);
    assert_eq!(request_id(batch.as_bytes()), None);
    let many: Vec<String> = (0..MAX_REQUEST_IDS_BYTES)
        .map(|i| format!(r#"{{"method":"a","id":{i}}}"#))
        .collect();
    assert_eq!(request_id(format!("[{}]", many.join(",")).as_bytes()), None);

    // A large argument before the id (the TypeScript SDK writes `id` last) hides nothing.
    let big_arg = format!(
        r#"{{"method":"x","params":{{"blob":"{}"}},"id":3}}"#,
        "a\\\"".repeat(1 << 19)
    );
    let mut s = RequestIdScanner::new();
    for chunk in big_arg.as_bytes().chunks(16 * 1024) {
        s.push(chunk);
    }
    assert_eq!(s.finish(), &Scan::Found("3".into()));
    let mut s = RequestIdScanner::new();
    s.push(br#"{"params":""#);
    let filler = vec![b'a'; 1 << 20];
    for _ in 1..MAX_SCAN_BYTES / filler.len() {
        assert_eq!(s.push(&filler), &Scan::Pending);
    }
    assert_eq!(s.push(&filler), &Scan::None);
}

#[test]
fn carried_texts_split_back_into_the_raw_ids() {
    assert_eq!(split_ids("7"), Some(vec!["7"]));
    assert_eq!(split_ids(r#""a,b""#), Some(vec![r#""a,b""#]));
    assert_eq!(
        split_ids(r#"[1,"x\",y",18446744073709551616]"#),
        Some(vec!["1", r#""x\",y""#, "18446744073709551616"])
    );
    for bad in [
        "",
        "null",
        "[]",
        "[1,]",
        "[1, 2]",
        r#"1,"x":2"#,
        "\"a\nb\"",
        r#""\x""#,
        r#""\u12""#,
        "[[1]]",
        "-",
        "1e",
        "+1",
    ] {
        assert!(!valid_request_id(bad), "{bad:?}");
    }
    assert!(!valid_request_id(&"1".repeat(MAX_REQUEST_IDS_BYTES + 1)));
    assert!(valid_request_id(&"1".repeat(MAX_REQUEST_IDS_BYTES)));
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod gen {
    //! Generated request bodies, and what a client's JSON parser reads from them.
    use proptest::prelude::*;

    /// An id as raw JSON text a client could have written.
    pub fn raw_id() -> impl Strategy<Value = String> {
        let int = prop_oneof![
            any::<i64>().prop_map(|n| n.to_string()),
            "-?[1-9][0-9]{18,40}",
            Just("0".to_string()),
            Just("-0".to_string()),
        ];
        let float = "-?(0|[1-9][0-9]{0,20})(\\.[0-9]{1,20})?([eE][+-]?[0-9]{1,3})?";
        // String contents: plain text, escapes, lone and paired surrogates, quotes, commas.
        let piece = prop_oneof![
            "[a-zA-Z0-9 ,:{}\\[\\]-]{0,8}",
            Just("\\\"".to_string()),
            Just("\\\\".to_string()),
            Just("\\/\\b\\f\\n\\r\\t".to_string()),
            Just("\\ud800".to_string()),
            Just("\\udc00x".to_string()),
            Just("\\ud83d\\ude00".to_string()),
            Just("é😀".to_string()),
            "\\\\u[0-9a-fA-F]{4}",
        ];
        let string = prop::collection::vec(piece, 0..8).prop_map(|p| format!("\"{}\"", p.concat()));
        let long = (1usize..3000).prop_map(|n| format!("\"{}\"", "L".repeat(n)));
        prop_oneof![int, float, string, long]
    }

    /// A key spelled as a client's parser reads `name`, possibly with escapes.
    pub fn key(name: &'static str) -> impl Strategy<Value = String> {
        prop::collection::vec(any::<bool>(), name.len()).prop_map(move |esc| {
            name.chars()
                .zip(esc)
                .map(|(c, e)| {
                    if e {
                        format!("\\u{:04x}", c as u32)
                    } else {
                        c.to_string()
                    }
                })
                .collect()
        })
    }

    /// Values that are not ids: they sit before and after, and some end in a duplicate `id`.
    pub fn noise() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(r#"{"id":1,"method":"n","x":[{"id":2}]}"#.to_string()),
            Just(r#"["id",{"i\u0064":"}\"{"}]"#.to_string()),
            Just("null".to_string()),
            Just(r#""id""#.to_string()),
            Just("-12.5e-3".to_string()),
        ]
    }

    /// One request object: members in any order, the `id` written `ids.len()` times (the last
    /// wins), and noise around it. Returns the body text and the raw text of the last id.
    pub fn request() -> impl Strategy<Value = (String, String)> {
        (
            prop::collection::vec(raw_id(), 1..3),
            key("id"),
            key("method"),
            noise(),
            noise(),
            any::<bool>(),
        )
            .prop_map(|(ids, id_key, method_key, before, after, id_first)| {
                let mut members = vec![
                    format!(r#""params":{before}"#),
                    format!(r#""{method_key}":"tools/call""#),
                ];
                let id_members = ids.iter().map(|id| format!(r#""{id_key}" : {id}"#));
                if id_first {
                    members.splice(0..0, id_members);
                } else {
                    members.extend(id_members);
                }
                members.push(format!(r#""extra":{after}"#));
                let last = ids.last().cloned().unwrap_or_default();
                (format!("{{{}}}", members.join(" ,")), last)
            })
    }

    /// A single request or a batch (with notifications mixed in); the raw ids expected, in order.
    pub fn body() -> impl Strategy<Value = (String, Vec<String>)> {
        prop_oneof![
            request().prop_map(|(b, id)| (b, vec![id])),
            prop::collection::vec((request(), any::<bool>()), 1..4).prop_map(|reqs| {
                let mut parts = Vec::new();
                let mut ids = Vec::new();
                for ((b, id), with_note) in reqs {
                    parts.push(b);
                    ids.push(id);
                    if with_note {
                        parts.push(r#"{"jsonrpc":"2.0","method":"notifications/x"}"#.into());
                    }
                }
                (format!("[ {} ]", parts.join(", ")), ids)
            }),
        ]
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod props {
    use super::gen::body;
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// The scanner reads the ids the client wrote, raw, in any chunking, or none at all when
        /// they are too long: never another id.
        #[test]
        fn the_scanner_reads_the_last_id_raw((body, ids) in body(), cut in 0usize..4096) {
            let mut s = RequestIdScanner::new();
            let (a, b) = body.as_bytes().split_at(cut.min(body.len()));
            s.push(a);
            s.push(b);
            let got = s.finish().clone();
            let carried = match body.trim_start().as_bytes().first() {
                Some(b'[') => format!("[{}]", ids.join(",")),
                _ => ids.concat(),
            };
            if carried.len() > MAX_REQUEST_IDS_BYTES {
                prop_assert_eq!(got, Scan::None);
            } else {
                prop_assert_eq!(&got, &Scan::Found(carried.clone()));
                let split: Vec<String> = split_ids(&carried).unwrap_or_default().into_iter().map(str::to_owned).collect();
                prop_assert_eq!(split, ids);
            }
        }
    }
}

/// The response schemas of the TypeScript SDK 1.32 (`types.js`: `JSONRPCResultResponseSchema`,
/// `JSONRPCErrorResponseSchema`, `.strict()`, `RequestIdSchema` = string | `int()`,
/// `ResultSchema` with `_meta`) and Python `mcp` 2.3 (`mcp_types/jsonrpc.py`: `RequestId` =
/// strict int | str, `ErrorData` with int `code` and str `message`, extra keys ignored).
#[test]
fn a_response_counts_only_as_every_clients_schema_reads_it() {
    use serde_json::json;
    // (message, TypeScript's reading: Some(result?) for a response, answers call 9 for both)
    let cases: &[(&str, Option<bool>, bool)] = &[
        (r#"{"jsonrpc":"2.0","id":9,"result":{}}"#, Some(true), true),
        (
            r#"{"jsonrpc":"2.0","id":9,"result":{"a":[1],"_meta":{}}}"#,
            Some(true),
            true,
        ),
        (
            r#"{"jsonrpc":"2.0","id":9,"result":{"_meta":{"progressToken":7,"k":null}}}"#,
            Some(true),
            true,
        ),
        (
            r#"{"jsonrpc":"2.0","id":9,"result":{"_meta":{"progressToken":"t"}}}"#,
            Some(true),
            true,
        ),
        (
            r#"{"jsonrpc":"2.0","id":9,"result":{"_meta":{"io.modelcontextprotocol/related-task":{"taskId":"t","x":1}}}}"#,
            Some(true),
            true,
        ),
        (
            r#"{"jsonrpc":"2.0","id":9,"error":{"code":-1,"message":"m"}}"#,
            Some(false),
            true,
        ),
        (
            r#"{"jsonrpc":"2.0","id":9,"error":{"code":2e0,"message":"m","data":[],"more":1}}"#,
            Some(false),
            true,
        ),
        // TypeScript takes these; Python's strict integer id does not: no answer.
        (
            r#"{"jsonrpc":"2.0","id":9.0,"result":{}}"#,
            Some(true),
            false,
        ),
        (
            r#"{"jsonrpc":"2.0","id":9e0,"result":{}}"#,
            Some(true),
            false,
        ),
        // Another id, a string id for an integer call, an error without id: no answer.
        (r#"{"jsonrpc":"2.0","id":8,"result":{}}"#, Some(true), false),
        (
            r#"{"jsonrpc":"2.0","id":"9","result":{}}"#,
            Some(true),
            false,
        ),
        (
            r#"{"jsonrpc":"2.0","error":{"code":1,"message":"m"}}"#,
            Some(false),
            false,
        ),
        // Refused by TypeScript's strict schemas.
        (r#"{"jsonrpc":"2.0","result":{}}"#, None, false),
        (r#"{"jsonrpc":"2.0","id":9,"result":{},"x":1}"#, None, false),
        (
            r#"{"jsonrpc":"2.0","id":9,"result":{},"error":{"code":1,"message":"m"}}"#,
            None,
            false,
        ),
        (
            r#"{"jsonrpc":"2.0","id":9,"result":{},"method":"m"}"#,
            None,
            false,
        ),
        (r#"{"jsonrpc":"2.0","id":9}"#, None, false),
        (r#"{"jsonrpc":"1.0","id":9,"result":{}}"#, None, false),
        (r#"{"id":9,"result":{}}"#, None, false),
        (r#"{"jsonrpc":"2.0","id":9.5,"result":{}}"#, None, false),
        (
            r#"{"jsonrpc":"2.0","id":9007199254740992,"result":{}}"#,
            None,
            false,
        ),
        (r#"{"jsonrpc":"2.0","id":null,"result":{}}"#, None, false),
        (r#"{"jsonrpc":"2.0","id":true,"result":{}}"#, None, false),
        (r#"{"jsonrpc":"2.0","id":9,"result":5}"#, None, false),
        (r#"{"jsonrpc":"2.0","id":9,"result":[]}"#, None, false),
        (r#"{"jsonrpc":"2.0","id":9,"result":"ok"}"#, None, false),
        (r#"{"jsonrpc":"2.0","id":9,"result":null}"#, None, false),
        (
            r#"{"jsonrpc":"2.0","id":9,"result":{"_meta":5}}"#,
            None,
            false,
        ),
        (
            r#"{"jsonrpc":"2.0","id":9,"result":{"_meta":null}}"#,
            None,
            false,
        ),
        (
            r#"{"jsonrpc":"2.0","id":9,"result":{"_meta":{"progressToken":null}}}"#,
            None,
            false,
        ),
        (
            r#"{"jsonrpc":"2.0","id":9,"result":{"_meta":{"progressToken":1.5}}}"#,
            None,
            false,
        ),
        (
            r#"{"jsonrpc":"2.0","id":9,"result":{"_meta":{"io.modelcontextprotocol/related-task":{"taskId":1}}}}"#,
            None,
            false,
        ),
        (r#"{"jsonrpc":"2.0","id":9,"error":"boom"}"#, None, false),
        (r#"{"jsonrpc":"2.0","id":9,"error":null}"#, None, false),
        (
            r#"{"jsonrpc":"2.0","id":9,"error":{"code":1}}"#,
            None,
            false,
        ),
        (
            r#"{"jsonrpc":"2.0","id":9,"error":{"message":"m"}}"#,
            None,
            false,
        ),
        (
            r#"{"jsonrpc":"2.0","id":9,"error":{"code":1.5,"message":"m"}}"#,
            None,
            false,
        ),
        (
            r#"{"jsonrpc":"2.0","id":9,"error":{"code":"1","message":"m"}}"#,
            None,
            false,
        ),
        (
            r#"{"jsonrpc":"2.0","id":9,"error":{"code":1,"message":null}}"#,
            None,
            false,
        ),
        (r#"[{"jsonrpc":"2.0","id":9,"result":{}}]"#, None, false),
        (r#"{"jsonrpc":"2.0","id":9,"method":"m"}"#, None, false),
    ];
    let call = json!(9);
    for &(text, ts, answers) in cases {
        let m: serde_json::Value = serde_json::from_str(text).unwrap();
        let r = client_response(&m);
        assert_eq!(r.map(|r| r.result), ts, "{text}");
        assert_eq!(r.is_some_and(|r| r.answers(&call)), answers, "{text}");
    }
    // A string id answers the call that sent that string.
    let m = json!({"jsonrpc":"2.0","id":"a","result":{}});
    assert!(client_response(&m).is_some_and(|r| r.answers(&json!("a"))));
}
