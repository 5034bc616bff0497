//! `mcp-sim --seed N --steps M [flags]`: runs seeds from N on, prints each failing seed with the
//! flags that replay it and the failing client's last events. `--seeds K` runs K seeds;
//! `--interference 1` checks invariant 4 instead (victim alone vs. with the others).
use std::io::Write as _;
use std::process::ExitCode;

/// `println!` that ignores a closed stdout (`mcp-sim … | head`).
macro_rules! say {
    ($($t:tt)*) => {{
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}
use std::time::Instant;

use mcp_sim::options::Options;
use mcp_sim::run::{differential, non_interference, run, trace};
use mcp_sim::service::StoreKind;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut opts = Options::default();
    let (mut seeds, mut interference, mut diff) = (1u64, false, false);
    for pair in args.chunks(2) {
        let (flag, value) = (pair[0].as_str(), pair.get(1).map_or("", String::as_str));
        let r = match flag {
            "--seeds" => value.parse().map(|n| seeds = n).map_err(|e| e.to_string()),
            "--interference" => {
                interference = value == "1";
                Ok(())
            }
            "--differential" => {
                diff = value == "1";
                Ok(())
            }
            _ => opts.set(flag, value),
        };
        if let Err(e) = r {
            eprintln!("mcp-sim: {e}");
            return ExitCode::from(2);
        }
    }
    if diff && opts.store == StoreKind::Memory {
        eprintln!("mcp-sim: --differential 1 compares memory with --store redis://HOST:PORT");
        return ExitCode::from(2);
    }
    let started = Instant::now();
    let (mut steps, mut failed) = (0u64, 0u32);
    let first = opts.seed;
    for seed in first..first.saturating_add(seeds) {
        opts.seed = seed;
        if interference {
            if let Some(v) = non_interference(&opts, opts.steps) {
                failed += 1;
                say!("FAIL seed {seed} {}: {}", v.invariant.name(), v.what);
                say!("  replay: mcp-sim {} --interference 1", opts.flags());
            }
            continue;
        }
        if diff {
            if let Some(v) = differential(&opts) {
                failed += 1;
                say!("FAIL seed {seed} {}: {}", v.invariant.name(), v.what);
                say!("  replay: mcp-sim {} --differential 1", opts.flags());
            }
            continue;
        }
        let r = run(&opts);
        steps += r.steps;
        if seeds == 1 {
            say!(
                "seed {seed}: {:?}, {} ms simulated; {}",
                r.stats,
                r.sim_ms,
                r.replicas
            );
        }
        if let Some(v) = r.violation {
            failed += 1;
            say!(
                "FAIL seed {seed} at step {} ({} ms simulated, {:.2} s wall) {}: client {}: {}",
                r.steps,
                r.sim_ms,
                started.elapsed().as_secs_f64(),
                v.invariant.name(),
                v.client,
                v.what
            );
            say!("  replicas: {}", r.replicas);
            say!(
                "  replay: mcp-sim {}",
                Options {
                    seed,
                    ..opts.clone()
                }
                .flags()
            );
            for line in trace(&opts, r.steps, &v, 40) {
                say!("  {line}");
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    if diff {
        say!(
            "mcp-sim: {seeds} seed(s) from {first}, each over memory and over {}, {} steps, in {secs:.1} s, {failed} failed",
            opts.store.name(),
            opts.steps
        );
    } else if interference {
        say!(
            "mcp-sim: {seeds} seed(s) from {first}, client 0 alone and among {} others for {} simulated ms each, in {secs:.1} s, {failed} failed",
            opts.clients.saturating_sub(1),
            opts.steps
        );
    } else {
        say!(
        "mcp-sim: {seeds} seed(s) from {first}, {steps} steps in {secs:.1} s ({:.0} steps/s), {failed} failed",
            steps as f64 / secs.max(1e-9)
        );
    }
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
