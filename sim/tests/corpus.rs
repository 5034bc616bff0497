//! Replays sim/seeds/corpus.txt: `pass` runs stay green, `xfail` runs still find their hole.
use mcp_sim::options::Options;
use mcp_sim::run::{non_interference, run};

struct Entry {
    name: String,
    expect: String,
    invariant: String,
    opts: Options,
    interference: bool,
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
        let mut interference = false;
        for pair in words[3..].chunks(2) {
            let value = pair.get(1).copied().unwrap_or("");
            if pair[0] == "--interference" {
                interference = value == "1";
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
    for e in &entries {
        let violation = if e.interference {
            non_interference(&e.opts, e.opts.steps)
        } else {
            run(&e.opts).violation
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
