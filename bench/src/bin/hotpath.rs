//! hotpath: the guard's per-event work on the native target, for profiling
//! (`valgrind --tool=callgrind target/.../hotpath 1024 20000`) and quick timing.
//!
//! Usage: `hotpath [EVENT_BYTES] [EVENTS] [CHUNK_BYTES] [FLUSH_EVERY]`: relays EVENTS events of
//! EVENT_BYTES through one `StreamState`, in body chunks of CHUNK_BYTES (default, or 0: one event
//! per chunk), taking the relayed ids after every chunk into a `RecordQueue` as the exchange
//! does, and flushing the queue (answered 200) every FLUSH_EVERY chunks (default 64; 0: no
//! records at all, only the stream).
//!
//! The relay loop is one function, `relay`, so callgrind can count it alone
//! (`callgrind_annotate --inclusive=yes`, its row divided by EVENTS); `allocs_per_event` counts the
//! heap allocations made inside it.
use mcp_resume_core::config::Config;
use mcp_resume_core::cursor::{Key, Keyring};
use mcp_resume_core::host::MockHost;
use mcp_resume_core::ownership::StreamKind;
use mcp_resume_core::records::{RecordQueue, StreamKey};
use mcp_resume_core::stream::StreamState;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Counts allocations (and reallocations), to show the relay path makes none per event.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// What one run of the relay loop saw.
struct Relayed {
    ids: usize,
    max_held: usize,
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let size = args.first().copied().unwrap_or(1024) as usize;
    let events = args.get(1).copied().unwrap_or(100_000);
    let chunk = args.get(2).copied().filter(|c| *c > 0).map(|c| c as usize);
    let flush_every = args.get(3).copied().unwrap_or(64) as usize;
    let cfg = match Config::from_json(
        br#"{"ownership":{"cluster":"c","max_queue":1000000},"keys":[{"id":1,"secret":"17Vjr1MOFuUicxThufiY1oswS2eQj+6Y1DdNdURfwT0=","active":true}]}"#,
    ) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let mut queue = RecordQueue::new(&cfg);
    let mut host = MockHost::new();
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
    let allocs = ALLOCS.load(Ordering::Relaxed);
    let t = Instant::now();
    let r = relay(
        &chunks,
        &keys,
        &mut s,
        &mut out,
        &mut queue,
        &mut host,
        flush_every,
    );
    let allocs = ALLOCS.load(Ordering::Relaxed) - allocs;
    let (ids, max_held) = (r.ids, r.max_held);
    let ns = t.elapsed().as_nanos() as f64 / events as f64;
    println!(
        "{{\"event_bytes\":{size},\"events\":{events},\"chunks\":{},\"ids\":{ids},\"ns_per_event\":{ns:.1},\"state_bytes\":{},\"max_held_bytes\":{max_held},\"allocs_per_event\":{:.3}}}",
        chunks.len(),
        std::mem::size_of::<StreamState>(),
        allocs as f64 / events.max(1) as f64
    );
}

/// The measured loop: every chunk through the stream, its relayed ids into the record queue.
#[inline(never)]
fn relay(
    chunks: &[&[u8]],
    keys: &Keyring,
    s: &mut StreamState,
    out: &mut Vec<u8>,
    queue: &mut RecordQueue,
    host: &mut MockHost,
    flush_every: usize,
) -> Relayed {
    let session = "0123456789abcdef0123456789abcdef";
    let incarnation = "0000000012345678";
    let mut ids = 0usize;
    let mut max_held = 0usize;
    let mut token = 0;
    for (i, c) in chunks.iter().enumerate() {
        out.clear();
        s.push(keys, c, out);
        if let Some((first, r)) = s.relayed() {
            ids += r.len();
            if flush_every > 0 {
                let key = StreamKey {
                    session,
                    incarnation,
                    branch: 0,
                };
                queue.push_events(host, &key, first, r.iter());
            }
        }
        s.clear_relayed();
        max_held = max_held.max(s.held_bytes());
        if flush_every > 0 && (i + 1) % flush_every == 0 {
            let _ = queue.on_response(host, token, Some(200), None);
            host.take();
            queue.flush(host);
            token = host.next_token.wrapping_sub(1);
        }
    }
    Relayed { ids, max_held }
}
