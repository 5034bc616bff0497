//! One seeded run, its replay with a trace, and the non-interference pair of runs.
use crate::options::Options;
use crate::oracle::{Invariant, Violation};
use crate::service::StoreKind;
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
    first_difference(
        &all.clients[0].outcomes,
        &alone.clients[0].outcomes,
        ("with others", "alone"),
    )
    .map(|what| Violation {
        invariant: Invariant::NonInterference,
        client: 0,
        logical: None,
        what: format!("client 0's {what}"),
    })
}

/// The first outcome at which `a` and `b` differ, with its neighbours, or `None`.
fn first_difference(a: &[String], b: &[String], names: (&str, &str)) -> Option<String> {
    let n = a.len().min(b.len());
    let first = (0..n).find(|i| a[*i] != b[*i]);
    let differ = first.or((a.len() != b.len()).then_some(n))?;
    let near = |v: &[String]| {
        v.get(differ.saturating_sub(2)..(differ + 3).min(v.len()))
            .map(<[String]>::to_vec)
    };
    Some(format!(
        "outcome #{differ} differs: {} {:?}, {} {:?}",
        names.0,
        near(a),
        names.1,
        near(b)
    ))
}

/// The same run over the memory store and over `opts.store` (Redis): every client's outcomes
/// must be the same, so the Lua and the Rust store rules cannot diverge unseen. A violation of
/// either run is reported as it is.
pub fn differential(opts: &Options) -> Option<Violation> {
    let mut o = opts.clone();
    o.store = StoreKind::Memory;
    let mut memory = World::new(o);
    memory.run();
    let mut redis = World::new(opts.clone());
    redis.run();
    if let Some(v) = redis.violation.clone().or(memory.violation.clone()) {
        if memory.violation != redis.violation {
            return Some(Violation {
                invariant: Invariant::Differential,
                client: v.client,
                logical: v.logical,
                what: format!(
                    "memory: {:?}; redis: {:?}",
                    memory.violation, redis.violation
                ),
            });
        }
        return Some(v);
    }
    memory
        .clients
        .iter()
        .zip(&redis.clients)
        .enumerate()
        .find_map(|(c, (m, r))| {
            first_difference(&m.outcomes, &r.outcomes, ("memory", "redis")).map(|what| Violation {
                invariant: Invariant::Differential,
                client: c,
                logical: None,
                what: format!("client {c}'s {what}"),
            })
        })
        .or_else(|| {
            (memory.steps != redis.steps).then(|| Violation {
                invariant: Invariant::Differential,
                client: 0,
                logical: None,
                what: format!("memory ran {} steps, redis {}", memory.steps, redis.steps),
            })
        })
}
