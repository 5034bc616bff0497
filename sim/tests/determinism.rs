//! A run is a function of its flags: the same seed replays exactly, another seed differs, and
//! a green run did exercise resumes.
use mcp_sim::options::Options;
use mcp_sim::run::run;

fn opts(seed: u64) -> Options {
    Options {
        seed,
        steps: 20_000,
        ..Options::default()
    }
}

#[test]
fn the_same_seed_replays_exactly() {
    let (a, b) = (run(&opts(5)), run(&opts(5)));
    assert_eq!(
        (a.steps, a.sim_ms, a.stats, a.violation),
        (b.steps, b.sim_ms, b.stats, b.violation)
    );
}

#[test]
fn another_seed_is_another_run() {
    let (a, b) = (run(&opts(5)), run(&opts(6)));
    assert_ne!((a.sim_ms, a.stats), (b.sim_ms, b.stats));
}

#[test]
fn a_green_run_resumes_and_continues() {
    let r = run(&opts(7));
    assert!(r.violation.is_none(), "{:?}", r.violation);
    assert!(r.stats.calls > 50 && r.stats.settled > 50, "{:?}", r.stats);
    assert!(
        r.stats.resumes > 10 && r.stats.continued > 5,
        "{:?}",
        r.stats
    );
}
