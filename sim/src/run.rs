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

/// Replays a failed run up to its failing step with client `client`'s trace; the last lines.
pub fn trace(opts: &Options, steps: u64, client: usize, lines: usize) -> Vec<String> {
    let mut o = opts.clone();
    o.steps = steps;
    o.trace = Some(client);
    let mut w = World::new(o);
    w.run();
    let skip = w.trace.len().saturating_sub(lines);
    w.trace.split_off(skip)
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
        what: format!(
            "client 0's outcome #{differ} differs: with others {:?}, alone {:?}",
            a.get(differ),
            b.get(differ)
        ),
    })
}
