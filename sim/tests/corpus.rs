//! Replays sim/seeds/corpus.txt: `pass` runs stay green, `xfail` runs still find their hole.
//! Lines with `--store redis` run over a redis-server this test starts on 127.0.0.1:6399
//! (+ `E2E_PORT_OFFSET`; or `SIM_REDIS_URL`'s), stopped when the test exits; without
//! redis-server they are skipped, said on stderr (`SIM_REQUIRE_REDIS=1` fails instead).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use std::process::Child;

use mcp_sim::options::Options;
use mcp_sim::run::{differential, non_interference, run};

struct Entry {
    name: String,
    expect: String,
    invariant: String,
    opts: Options,
    interference: bool,
    differential: bool,
    /// Over the test's Redis.
    redis: bool,
}

/// A redis-server for the corpus, under a watchdog shell that stops it (by pid) once this
/// process is gone; `None` when redis-server is not installed.
fn start_redis(port: u16) -> Option<Child> {
    if !redis_test_server::installed() {
        return None;
    }
    Some(redis_test_server::start(port, "").expect("redis-server"))
}

/// The Redis URL for `--store redis` lines, and the server this test started (if it did).
fn redis_url() -> (Option<String>, Option<Child>) {
    if let Ok(url) = std::env::var("SIM_REDIS_URL") {
        return (Some(url), None);
    }
    let offset: u16 = std::env::var("E2E_PORT_OFFSET")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let port = 6399 + offset;
    match start_redis(port) {
        Some(child) => (Some(format!("redis://127.0.0.1:{port}")), Some(child)),
        None => (None, None),
    }
}

fn corpus() -> Result<Vec<Entry>, String> {
    let text = include_str!("../seeds/corpus.txt");
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.len() < 3 {
            return Err(format!("corpus line: {line}"));
        }
        let mut opts = Options::default();
        let (mut interference, mut differential, mut redis) = (false, false, false);
        for pair in words[3..].chunks(2) {
            let value = pair.get(1).copied().unwrap_or("");
            match (pair[0], value) {
                ("--interference", v) => interference = v == "1",
                ("--differential", v) => differential = v == "1",
                ("--store", "redis") => redis = true,
                _ => {}
            }
            if matches!(pair[0], "--interference" | "--differential")
                || redis && pair[0] == "--store"
            {
                continue;
            }
            opts.set(pair[0], value)
                .map_err(|e| format!("{}: {e}", words[0]))?;
        }
        out.push(Entry {
            name: words[0].to_owned(),
            expect: words[1].to_owned(),
            invariant: words[2].to_owned(),
            opts,
            interference,
            differential,
            redis,
        });
    }
    Ok(out)
}

#[test]
fn every_corpus_run_ends_as_the_corpus_says() {
    let entries = corpus();
    assert!(entries.is_ok(), "{:?}", entries.err());
    let entries = entries.unwrap_or_default();
    assert!(entries.len() >= 10, "the corpus lost its entries");
    let mut wrong = Vec::new();
    let (url, _server) = if entries.iter().any(|e| e.redis) {
        redis_url()
    } else {
        (None, None)
    };
    let require = std::env::var("SIM_REQUIRE_REDIS").is_ok_and(|v| v == "1");
    assert!(
        url.is_some() || !require,
        "SIM_REQUIRE_REDIS=1 and no redis-server"
    );
    for e in &entries {
        let mut opts = e.opts.clone();
        if e.redis {
            let Some(url) = &url else {
                eprintln!("corpus: {} skipped: redis-server is not installed", e.name);
                continue;
            };
            opts.set("--store", url).unwrap();
        }
        let violation = if e.differential {
            differential(&opts)
        } else if e.interference {
            non_interference(&opts, opts.steps)
        } else {
            run(&opts).violation
        };
        let got = violation.as_ref().map(|v| v.invariant.name());
        let ok = match e.expect.as_str() {
            "pass" => got.is_none(),
            // A known hole, or a self-test that proves a check can fail.
            "xfail" | "fails" => got == Some(e.invariant.as_str()),
            _ => false,
        };
        if !ok {
            wrong.push(format!(
                "{} ({} {}): got {:?}",
                e.name, e.expect, e.invariant, violation
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "corpus runs that changed:\n{}",
        wrong.join("\n")
    );
}
