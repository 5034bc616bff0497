//! hotpath: the guard's per-event work on the native target, for profiling
//! (`valgrind --tool=callgrind target/.../hotpath 1024 20000`) and quick timing.
//!
//! Usage: `hotpath [EVENT_BYTES] [EVENTS] [CHUNK_BYTES]`: relays EVENTS events of EVENT_BYTES
//! through one `StreamState`, in body chunks of CHUNK_BYTES (default: one event per chunk),
//! taking the relayed ids after every chunk as the adapter does.
use mcp_resume_core::cursor::{Key, Keyring};
use mcp_resume_core::ownership::StreamKind;
use mcp_resume_core::stream::StreamState;
use std::time::Instant;

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let size = args.first().copied().unwrap_or(1024) as usize;
    let events = args.get(1).copied().unwrap_or(100_000);
    let chunk = args.get(2).copied().map(|c| c as usize);
    let keys = match Keyring::new(
        Key {
            id: 1,
            secret: vec![0x42; 32],
        },
        vec![],
    ) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let payload = "x".repeat(size.saturating_sub(22).max(1));
    let mut input = Vec::new();
    let mut bounds = Vec::new();
    for n in 1..=events {
        input.extend_from_slice(format!("id: {n}\ndata: {payload}\n\n").as_bytes());
        bounds.push(input.len());
    }
    let chunks: Vec<&[u8]> = match chunk {
        Some(c) => input.chunks(c.max(1)).collect(),
        None => {
            let mut v = Vec::new();
            let mut prev = 0;
            for &b in &bounds {
                v.push(input.get(prev..b).unwrap_or_default());
                prev = b;
            }
            v
        }
    };
    let mut s = StreamState::fresh([7; 8], 0x1234_5678, StreamKind::Get, 65536);
    let mut out = Vec::with_capacity(size * 2 + 256);
    let mut ids = 0usize;
    let mut max_held = 0usize;
    let t = Instant::now();
    for c in &chunks {
        out.clear();
        s.push(&keys, c, &mut out);
        if let Some((_, r)) = s.take_relayed() {
            ids += r.len();
        }
        max_held = max_held.max(s.held_bytes());
    }
    let ns = t.elapsed().as_nanos() as f64 / events as f64;
    println!(
        "{{\"event_bytes\":{size},\"events\":{events},\"chunks\":{},\"ids\":{ids},\"ns_per_event\":{ns:.1},\"state_bytes\":{},\"max_held_bytes\":{max_held}}}",
        chunks.len(),
        std::mem::size_of::<StreamState>()
    );
}
