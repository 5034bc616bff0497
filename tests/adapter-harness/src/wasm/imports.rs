//! The host calls a proxy-wasm module imports (ABI 0.2.1, as Envoy implements them), and the
//! few WASI calls the Rust standard library makes. Any other import traps, by name, when called.
use super::state::{Callout, Headers, HostState, LocalReply, Metric};
use wasmi::{Caller, Error, Extern, Linker, Module};

const OK: i32 = 0;
const NOT_FOUND: i32 = 1;
const BAD_ARGUMENT: i32 = 2;

// Map and buffer types of the ABI.
const REQUEST_HEADERS: i32 = 0;
const RESPONSE_HEADERS: i32 = 2;
const CALL_RESPONSE_HEADERS: i32 = 6;
const REQUEST_BODY: i32 = 0;
const RESPONSE_BODY: i32 = 1;
const CALL_RESPONSE_BODY: i32 = 4;
const VM_CONFIGURATION: i32 = 6;
const PLUGIN_CONFIGURATION: i32 = 7;

type C<'a> = Caller<'a, HostState>;

fn memory(c: &C<'_>) -> Result<wasmi::Memory, Error> {
    c.get_export("memory")
        .and_then(Extern::into_memory)
        .ok_or_else(|| Error::new("the module exports no memory"))
}

fn read(c: &C<'_>, ptr: i32, len: i32) -> Result<Vec<u8>, Error> {
    let mut b = vec![0u8; len as u32 as usize];
    memory(c)?
        .read(c, ptr as u32 as usize, &mut b)
        .map_err(|e| Error::new(format!("read {len} bytes at {ptr}: {e}")))?;
    Ok(b)
}

fn read_str(c: &C<'_>, ptr: i32, len: i32) -> Result<String, Error> {
    String::from_utf8(read(c, ptr, len)?).map_err(|e| Error::new(e.to_string()))
}

fn write(c: &mut C<'_>, ptr: i32, bytes: &[u8]) -> Result<(), Error> {
    memory(c)?
        .write(c, ptr as u32 as usize, bytes)
        .map_err(|e| Error::new(format!("write {} bytes at {ptr}: {e}", bytes.len())))
}

fn write_u32(c: &mut C<'_>, ptr: i32, v: u32) -> Result<(), Error> {
    write(c, ptr, &v.to_le_bytes())
}

/// Hands `bytes` to the module: copied into memory it allocates (`proxy_on_memory_allocate`,
/// which the module then owns), the address and size written to its return slots.
fn give(c: &mut C<'_>, bytes: &[u8], ret_ptr: i32, ret_size: i32) -> Result<(), Error> {
    let mut at = 0;
    if !bytes.is_empty() {
        let alloc = c
            .get_export("proxy_on_memory_allocate")
            .and_then(Extern::into_func)
            .ok_or_else(|| Error::new("the module exports no proxy_on_memory_allocate"))?
            .typed::<i32, i32>(&*c)?;
        c.data_mut().allocations += 1;
        at = alloc.call(&mut *c, bytes.len() as i32)?;
        write(c, at, bytes)?;
    }
    write_u32(c, ret_ptr, at as u32)?;
    write_u32(c, ret_size, bytes.len() as u32)
}

/// The ABI's map encoding: count, (key length, value length) per pair, then each key and value
/// followed by a NUL.
pub fn serialize_map(h: &Headers) -> Vec<u8> {
    let mut out = (h.len() as u32).to_le_bytes().to_vec();
    for (k, v) in h {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
    }
    for (k, v) in h {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v);
        out.push(0);
    }
    out
}

/// The inverse of [`serialize_map`]; `None` when the bytes are not a map.
pub fn deserialize_map(b: &[u8]) -> Option<Headers> {
    if b.is_empty() {
        return Some(Vec::new());
    }
    let u32_at = |i: usize| -> Option<usize> {
        Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?) as usize)
    };
    let n = u32_at(0)?;
    let mut p = 4 + n * 8;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let (kl, vl) = (u32_at(4 + i * 8)?, u32_at(8 + i * 8)?);
        let k = String::from_utf8(b.get(p..p + kl)?.to_vec()).ok()?;
        p += kl + 1;
        let v = b.get(p..p + vl)?.to_vec();
        p += vl + 1;
        out.push((k, v));
    }
    Some(out)
}

fn stream_map(s: &mut HostState, map: i32) -> Option<&mut Headers> {
    if map == CALL_RESPONSE_HEADERS {
        return s.call_response.as_mut().map(|(h, _)| h);
    }
    let stream = s.streams.get_mut(&s.effective)?;
    match map {
        REQUEST_HEADERS => Some(&mut stream.request_headers),
        RESPONSE_HEADERS => Some(&mut stream.response_headers),
        _ => None,
    }
}

fn buffer(s: &mut HostState, which: i32) -> Option<&mut Vec<u8>> {
    match which {
        PLUGIN_CONFIGURATION => Some(&mut s.plugin_config),
        CALL_RESPONSE_BODY => s.call_response.as_mut().map(|(_, b)| b),
        _ => {
            let stream = s.streams.get_mut(&s.effective)?;
            match which {
                REQUEST_BODY => {
                    stream.request_body_reads += 1;
                    Some(&mut stream.request_body)
                }
                RESPONSE_BODY => Some(&mut stream.response_body),
                _ => None,
            }
        }
    }
}

/// The names this host implements; every other import of the module traps when called.
const IMPLEMENTED: &[&str] = &[
    "proxy_log",
    "proxy_set_tick_period_milliseconds",
    "proxy_get_current_time_nanoseconds",
    "proxy_get_buffer_bytes",
    "proxy_set_buffer_bytes",
    "proxy_get_header_map_pairs",
    "proxy_set_header_map_pairs",
    "proxy_get_header_map_value",
    "proxy_replace_header_map_value",
    "proxy_add_header_map_value",
    "proxy_remove_header_map_value",
    "proxy_get_property",
    "proxy_define_metric",
    "proxy_increment_metric",
    "proxy_record_metric",
    "proxy_send_local_response",
    "proxy_http_call",
    "proxy_continue_stream",
    "proxy_close_stream",
    "proxy_set_effective_context",
    "proxy_done",
    "random_get",
    "fd_write",
    "environ_get",
    "environ_sizes_get",
    "proc_exit",
];

/// Defines every import of `module` in `linker`.
pub fn define(linker: &mut Linker<HostState>, module: &Module) -> Result<(), Error> {
    proxy(linker)?;
    wasi(linker)?;
    for import in module.imports() {
        if IMPLEMENTED.contains(&import.name()) {
            continue;
        }
        if let wasmi::ExternType::Func(ty) = import.ty() {
            let what = format!("{}::{}", import.module(), import.name());
            linker.func_new(
                import.module(),
                import.name(),
                ty.clone(),
                move |_, _, _| {
                    Err(Error::new(format!(
                        "host call {what} is not implemented by the test host"
                    )))
                },
            )?;
        }
    }
    Ok(())
}

fn proxy(l: &mut Linker<HostState>) -> Result<(), Error> {
    l.func_wrap(
        "env",
        "proxy_log",
        |mut c: C<'_>, level: i32, p: i32, n: i32| {
            c.data_mut().hit("proxy_log");
            let msg = String::from_utf8_lossy(&read(&c, p, n)?).into_owned();
            c.data_mut().logs.push((level as u32, msg));
            Ok::<i32, Error>(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_tick_period_milliseconds",
        |mut c: C<'_>, ms: i32| {
            c.data_mut().hit("proxy_set_tick_period_milliseconds");
            c.data_mut().tick_ms = Some(ms as u32);
            OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_current_time_nanoseconds",
        |mut c: C<'_>, ret: i32| {
            c.data_mut().hit("proxy_get_current_time_nanoseconds");
            let now = c.data().now_ns;
            write(&mut c, ret, &now.to_le_bytes())?;
            Ok::<i32, Error>(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_buffer_bytes",
        |mut c: C<'_>, which: i32, start: i32, max: i32, ret_p: i32, ret_n: i32| {
            c.data_mut().hit("proxy_get_buffer_bytes");
            if which == VM_CONFIGURATION {
                return Ok(NOT_FOUND);
            }
            let Some(b) = buffer(c.data_mut(), which) else {
                return Ok(NOT_FOUND);
            };
            let start = (start as u32 as usize).min(b.len());
            let end = start.saturating_add(max as u32 as usize).min(b.len());
            let bytes = b[start..end].to_vec();
            give(&mut c, &bytes, ret_p, ret_n)?;
            Ok::<i32, Error>(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_buffer_bytes",
        |mut c: C<'_>, which: i32, start: i32, size: i32, p: i32, n: i32| {
            c.data_mut().hit("proxy_set_buffer_bytes");
            let data = read(&c, p, n)?;
            let Some(b) = buffer(c.data_mut(), which) else {
                return Ok(NOT_FOUND);
            };
            let (start, size) = (start as u32 as usize, size as u32 as usize);
            // Envoy's rules: replace all, prepend, or append; nothing in between.
            if start == 0 && size >= b.len() {
                *b = data;
            } else if start == 0 && size == 0 {
                b.splice(0..0, data);
            } else if start >= b.len() {
                b.extend_from_slice(&data);
            } else {
                return Ok(BAD_ARGUMENT);
            }
            Ok::<i32, Error>(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_header_map_pairs",
        |mut c: C<'_>, map: i32, ret_p: i32, ret_n: i32| {
            c.data_mut().hit("proxy_get_header_map_pairs");
            let Some(h) = stream_map(c.data_mut(), map) else {
                return Ok(NOT_FOUND);
            };
            let bytes = serialize_map(h);
            give(&mut c, &bytes, ret_p, ret_n)?;
            Ok::<i32, Error>(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_set_header_map_pairs",
        |mut c: C<'_>, map: i32, p: i32, n: i32| {
            c.data_mut().hit("proxy_set_header_map_pairs");
            let new = deserialize_map(&read(&c, p, n)?).ok_or_else(|| Error::new("bad map"))?;
            let Some(h) = stream_map(c.data_mut(), map) else {
                return Ok(NOT_FOUND);
            };
            *h = new;
            Ok::<i32, Error>(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_header_map_value",
        |mut c: C<'_>, map: i32, kp: i32, kn: i32, ret_p: i32, ret_n: i32| {
            c.data_mut().hit("proxy_get_header_map_value");
            let key = read_str(&c, kp, kn)?;
            let Some(h) = stream_map(c.data_mut(), map) else {
                return Ok(NOT_FOUND);
            };
            let Some(v) = h.iter().find(|(k, _)| k.eq_ignore_ascii_case(&key)) else {
                return Ok(NOT_FOUND);
            };
            let v = v.1.clone();
            give(&mut c, &v, ret_p, ret_n)?;
            Ok::<i32, Error>(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_replace_header_map_value",
        |mut c: C<'_>, map: i32, kp: i32, kn: i32, vp: i32, vn: i32| {
            c.data_mut().hit("proxy_replace_header_map_value");
            let (key, value) = (
                read_str(&c, kp, kn)?.to_ascii_lowercase(),
                read(&c, vp, vn)?,
            );
            let Some(h) = stream_map(c.data_mut(), map) else {
                return Ok(NOT_FOUND);
            };
            // The first one keeps its place and takes the value; any others go.
            match h.iter().position(|(k, _)| *k == key) {
                Some(i) => {
                    h[i].1 = value;
                    let mut n = 0;
                    h.retain(|(k, _)| {
                        n += usize::from(*k == key);
                        *k != key || n == 1
                    });
                }
                None => h.push((key, value)),
            }
            Ok::<i32, Error>(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_add_header_map_value",
        |mut c: C<'_>, map: i32, kp: i32, kn: i32, vp: i32, vn: i32| {
            c.data_mut().hit("proxy_add_header_map_value");
            let (key, value) = (
                read_str(&c, kp, kn)?.to_ascii_lowercase(),
                read(&c, vp, vn)?,
            );
            let Some(h) = stream_map(c.data_mut(), map) else {
                return Ok(NOT_FOUND);
            };
            h.push((key, value));
            Ok::<i32, Error>(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_remove_header_map_value",
        |mut c: C<'_>, map: i32, kp: i32, kn: i32| {
            c.data_mut().hit("proxy_remove_header_map_value");
            let key = read_str(&c, kp, kn)?.to_ascii_lowercase();
            let Some(h) = stream_map(c.data_mut(), map) else {
                return Ok(NOT_FOUND);
            };
            h.retain(|(k, _)| *k != key);
            Ok::<i32, Error>(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_get_property",
        |mut c: C<'_>, p: i32, n: i32, ret_p: i32, ret_n: i32| {
            c.data_mut().hit("proxy_get_property");
            let path = read(&c, p, n)?
                .split(|b| *b == 0)
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect::<Vec<_>>()
                .join(".");
            let s = c.data();
            let Some(v) = s
                .streams
                .get(&s.effective)
                .and_then(|st| st.properties.get(&path))
                .map(|v| v.to_vec())
            else {
                return Ok(NOT_FOUND);
            };
            give(&mut c, &v, ret_p, ret_n)?;
            Ok::<i32, Error>(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_define_metric",
        |mut c: C<'_>, kind: i32, p: i32, n: i32, ret: i32| {
            c.data_mut().hit("proxy_define_metric");
            let name = read_str(&c, p, n)?;
            let metrics = &mut c.data_mut().metrics;
            // Ids start at 1: the guard reads 0 as "not defined".
            let id = match metrics.iter().position(|m| m.name == name) {
                Some(i) => i + 1,
                None => {
                    metrics.push(Metric {
                        name,
                        kind: kind as u32,
                        value: 0,
                        samples: Vec::new(),
                    });
                    metrics.len()
                }
            };
            write_u32(&mut c, ret, id as u32)?;
            Ok::<i32, Error>(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_increment_metric",
        |mut c: C<'_>, id: i32, by: i64| {
            c.data_mut().hit("proxy_increment_metric");
            let Some(m) = c.data_mut().metrics.get_mut((id as usize).wrapping_sub(1)) else {
                return NOT_FOUND;
            };
            m.value += by;
            OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_record_metric",
        |mut c: C<'_>, id: i32, value: i64| {
            c.data_mut().hit("proxy_record_metric");
            let Some(m) = c.data_mut().metrics.get_mut((id as usize).wrapping_sub(1)) else {
                return NOT_FOUND;
            };
            if m.kind == 2 {
                m.samples.push(value as u64);
            } else {
                m.value = value;
            }
            OK
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_send_local_response",
        |mut c: C<'_>,
         status: i32,
         dp: i32,
         dn: i32,
         bp: i32,
         bn: i32,
         hp: i32,
         hn: i32,
         _grpc: i32| {
            c.data_mut().hit("proxy_send_local_response");
            let reply = LocalReply {
                status: status as u32,
                details: read_str(&c, dp, dn)?,
                body: read(&c, bp, bn)?,
                headers: deserialize_map(&read(&c, hp, hn)?)
                    .ok_or_else(|| Error::new("bad headers"))?,
            };
            let s = c.data_mut();
            let Some(stream) = s.streams.get_mut(&s.effective) else {
                return Ok(NOT_FOUND);
            };
            stream.local_replies.push(reply);
            Ok::<i32, Error>(OK)
        },
    )?;
    l.func_wrap(
        "env",
        "proxy_http_call",
        |mut c: C<'_>,
         up: i32,
         un: i32,
         hp: i32,
         hn: i32,
         bp: i32,
         bn: i32,
         tp: i32,
         tn: i32,
         timeout: i32,
         ret: i32| {
            c.data_mut().hit("proxy_http_call");
            let cluster = read_str(&c, up, un)?;
            let headers =
                deserialize_map(&read(&c, hp, hn)?).ok_or_else(|| Error::new("bad headers"))?;
            let _trailers = read(&c, tp, tn)?;
            let body = read(&c, bp, bn)?;
            let s = c.data_mut();
            s.next_token += 1;
            let token = s.next_token;
            let context = s.effective;
            s.callouts.push(Callout {
                token,
                context,
                cluster,
                headers,
                body,
                timeout_ms: timeout as u32,
            });
            write_u32(&mut c, ret, token)?;
            Ok::<i32, Error>(OK)
        },
    )?;
    l.func_wrap("env", "proxy_continue_stream", |mut c: C<'_>, t: i32| {
        c.data_mut().hit("proxy_continue_stream");
        let s = c.data_mut();
        match s.streams.get_mut(&s.effective) {
            Some(st) => {
                st.continued.push(t as u32);
                OK
            }
            None => NOT_FOUND,
        }
    })?;
    l.func_wrap("env", "proxy_close_stream", |mut c: C<'_>, t: i32| {
        c.data_mut().hit("proxy_close_stream");
        let s = c.data_mut();
        match s.streams.get_mut(&s.effective) {
            Some(st) => {
                st.closed.push(t as u32);
                OK
            }
            None => NOT_FOUND,
        }
    })?;
    l.func_wrap(
        "env",
        "proxy_set_effective_context",
        |mut c: C<'_>, ctx: i32| {
            c.data_mut().hit("proxy_set_effective_context");
            let s = c.data_mut();
            let ctx = ctx as u32;
            if ctx == s.root_context || s.streams.contains_key(&ctx) {
                s.effective = ctx;
                OK
            } else {
                BAD_ARGUMENT
            }
        },
    )?;
    l.func_wrap("env", "proxy_done", |_: C<'_>| OK)?;
    Ok(())
}

fn wasi(l: &mut Linker<HostState>) -> Result<(), Error> {
    const W: &str = "wasi_snapshot_preview1";
    l.func_wrap(W, "random_get", |mut c: C<'_>, p: i32, n: i32| {
        c.data_mut().hit("random_get");
        // Deterministic (xorshift): a test run can be repeated.
        let mut out = Vec::with_capacity(n as u32 as usize);
        let s = c.data_mut();
        while out.len() < n as u32 as usize {
            let mut x = s.random_state | 1;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            s.random_state = x;
            out.extend_from_slice(&x.to_le_bytes());
        }
        out.truncate(n as u32 as usize);
        write(&mut c, p, &out)?;
        Ok::<i32, Error>(0)
    })?;
    l.func_wrap(
        W,
        "fd_write",
        |mut c: C<'_>, _fd: i32, iovs: i32, n: i32, ret: i32| {
            c.data_mut().hit("fd_write");
            let mut total = 0u32;
            for i in 0..n {
                let iov = read(&c, iovs + i * 8, 8)?;
                let p = i32::from_le_bytes([iov[0], iov[1], iov[2], iov[3]]);
                let len = i32::from_le_bytes([iov[4], iov[5], iov[6], iov[7]]);
                let bytes = read(&c, p, len)?;
                total += bytes.len() as u32;
                c.data_mut().output.extend_from_slice(&bytes);
            }
            write_u32(&mut c, ret, total)?;
            Ok::<i32, Error>(0)
        },
    )?;
    l.func_wrap(
        W,
        "environ_sizes_get",
        |mut c: C<'_>, count: i32, size: i32| {
            c.data_mut().hit("environ_sizes_get");
            write_u32(&mut c, count, 0)?;
            write_u32(&mut c, size, 0)?;
            Ok::<i32, Error>(0)
        },
    )?;
    l.func_wrap(W, "environ_get", |_: C<'_>, _: i32, _: i32| 0)?;
    l.func_wrap(W, "proc_exit", |_: C<'_>, code: i32| -> Result<(), Error> {
        Err(Error::i32_exit(code))
    })?;
    Ok(())
}
