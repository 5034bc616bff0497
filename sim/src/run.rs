//! One seeded run, its replay with a trace, and the non-interference pair of runs.
use crate::options::Options;
use crate::oracle::{Invariant, Violation};
use crate::world::{Stats, World};

pub struct Report {
    pub steps: u64,
    pub sim_ms: u64,
    pub violation: Option<Violation>,
    pub replicas: String,
    pub stats: Stats,
}

pub fn run(opts: &Options) -> Report {
    let mut w = World::new(opts.clone());
    w.run();
    Report {
        replicas: w.describe(),
        stats: w.stats,
        steps: w.steps,
        sim_ms: w.net.now,
        violation: w.violation,
    }
}

/// Replays a failed run up to its failing step with the trace of the violation's client: the
/// last `lines` lines about its logical stream.
pub fn trace(opts: &Options, steps: u64, v: &Violation, lines: usize) -> Vec<String> {
    let mut o = opts.clone();
    o.steps = steps;
    o.trace = Some(v.client);
    let mut w = World::new(o);
    w.run();
    let mine: Vec<String> = w
        .trace
        .into_iter()
        .filter(|(l, _)| v.logical.is_none() || *l == v.logical)
        .map(|(_, line)| line)
        .collect();
    let skip = mine.len().saturating_sub(lines);
    mine[skip..].to_vec()
}

/// Invariant 4: client 0's outcomes alone and among the others, over the same `until_ms` of
/// simulated time, must be the same.
pub fn non_interference(opts: &Options, until_ms: u64) -> Option<Violation> {
    let mut o = opts.clone();
    o.steps = u64::MAX;
    let mut all = World::new(o.clone());
    all.run_until(until_ms);
    if let Some(v) = all.violation {
        return Some(v);
    }
    o.only_client = Some(0);
    let mut alone = World::new(o);
    alone.run_until(until_ms);
    if let Some(v) = alone.violation {
        return Some(v);
    }
    let (a, b) = (&all.clients[0].outcomes, &alone.clients[0].outcomes);
    let n = a.len().min(b.len());
    let first = (0..n).find(|i| a[*i] != b[*i]);
    let differ = first.or((a.len() != b.len()).then_some(n))?;
    Some(Violation {
        invariant: Invariant::NonInterference,
        client: 0,
        logical: None,
        what: format!(
            "client 0's outcome #{differ} differs: with others {:?}, alone {:?}",
            a.get(differ.saturating_sub(2)..(differ + 3).min(a.len())),
            b.get(differ.saturating_sub(2)..(differ + 3).min(b.len()))
        ),
    })
}
