//! The Lua scripts of the Redis store. Each runs atomically on the Redis server, on the keys of
//! ONE session (one hash slot: every key carries the session's `{hash tag}`), so a record and a
//! verdict snapshot never interleave, on a single node or on Redis Cluster.
//!
//! Key layout, `P` = prefix (default `mrg:`), `S` = the session key (32 hex):
//!
//! | key | type | content |
//! | --- | --- | --- |
//! | `P{S}:s` | hash | `st` state (`a` active, `t` terminated, `e` expired), `lu` last used ms (pending: when it appeared), `pv` 1 while pending (records, no `session_open` yet), `hm` 1 when re-created over incarnations whose hash was lost (reads `records_lost` for good), `v` protocol version, `tk` record tick, `gq`/`gi` newest standalone GET stream (its order, incarnation) |
//! | `P{S}:n` | zset | incarnation id → tick of its last record (least recently recorded is evicted first) |
//! | `P{S}:i:<inc>` | hash | `o` opened (1), `k` kind (`g`/`r`), `ow` owner, `ep` owner epoch at open, `r` retention, `sq` order (the session's `tk` when its first StreamOpen was applied), `l` lost (1), `ff` and `fl` first and latest `owner_failed` ms since the owner last answered (events, a clean end), `rq` the StreamOpen's JSON-RPC id (raw JSON), `h` head, `tf` the highest `first_seq` of `events` that said seqs before it were trimmed by the guard (a hole below it never fills), `b` 1 once the incarnation has a branch table, `bn` the table's `n` as last written (a table gone, or with another `n`, was lost apart from the incarnation: it is then lost, never renumbered) |
//! | `P{S}:w:<inc>` | hash | seq → replica event id (recorded form), only `head - max_window < seq <= head` |
//! | `P{S}:l:<inc>` | hash | seq → full replica id, for the newest `LONG_IDS_KEPT` seqs whose id was long |
//! | `P{S}:b:<inc>` | hash | the incarnation's branches (docs/forks.md), made by the first continuation registered: `n` the highest branch number handed out, `t` the table's relay order (a counter of accepted `events`), `w` the branch whose `events` were recorded last, `a` the `abandoned` records that came before their registration (`"<registration>:<ms>"` entries, oldest first, at most `ABANDONED_KEPT`, each for `REGISTRATION_GRACE_MS`), and branch number → `"<state: 1 open, 0 ended, 2 cut (overtaken)> <first> <latest> <registered ms> <registration>"`, the relay order of its first and latest accepted `events` (-1: none yet; branch 0 starts at 0), when it was registered (0: unknown) and the resume's registration token (optional), for branch 0 and at most `BRANCHES_KEPT` numbers from 1 (ended ones go first, then open ones that never relayed, then the oldest); expires and is deleted with the incarnation |
//! | `Psessions` | zset | opened session → last write ms (the sweep's index and the session count; not in the session's slot) |
//! | `Ppending` | zset | pending session → when it appeared (its own cap and TTL; not in the session's slot) |
//! | `Prefused` | string | set, expiring after the idle TTL, when a write was refused: unknown sessions read `records_lost` |
//! | `Powners` | hash | owner `ip:port` → epoch, `max(previous + 1, now ms)` at each `owner_gone` (not in the session's slot; forgotten by the sweep 2 × keep after its last bump) |
//!
//! Numbers are written with `%d`: Lua's default number-to-string conversion keeps only 14
//! significant digits, which would round sequence numbers near 2^53.

use crate::store::{ABANDONED_KEPT, BRANCHES_KEPT, REGISTRATION_GRACE_MS};

/// Helpers shared by every script. `ARGV[1]` is always the key base `P{S}`.
const PRELUDE: &str = r#"
local base = ARGV[1]
local now = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local skey = base .. ':s'
local nkey = base .. ':n'
local function fmt(n) return string.format('%d', n) end
local function ikey(inc) return base .. ':i:' .. inc end
local function wkey(inc) return base .. ':w:' .. inc end
local function lkey(inc) return base .. ':l:' .. inc end
local function bkey(inc) return base .. ':b:' .. inc end
local function chunked(cmd, key, list, step)
  for j = 1, #list, step do
    redis.call(cmd, key, unpack(list, j, math.min(j + step - 1, #list)))
  end
end
local function drop_session()
  local incs = redis.call('ZRANGE', nkey, 0, -1)
  for _, inc in ipairs(incs) do redis.call('DEL', ikey(inc), wkey(inc), lkey(inc), bkey(inc)) end
  redis.call('DEL', skey, nkey)
end
"#;

/// An incarnation's branch table (docs/forks.md), for the scripts that arbitrate with it.
const BRANCHES: &str = r#"
-- The table of `inc`, or nil: {top, kept = {[number] = {open, cut, first, latest, at, lm, reg}}}.
local function branches(inc)
  local raw = redis.call('HGETALL', bkey(inc))
  local t = {kept = {}}
  for j = 1, #raw, 2 do
    local k, v = raw[j], raw[j + 1]
    if k == 'n' then
      t.top = tonumber(v)
    elseif k == 'w' then
      t.writer = tonumber(v)
    elseif k ~= 't' and k ~= 'a' then
      -- "o first latest at m<latest ms> [registration]"; written before latest ms:
      -- "o first latest [at] [registration]" (the `m` keeps the two apart).
      local o, f, l, r, m, g = string.match(v, '^(%d) (%-?%d+) (%-?%d+) (%d+) m(%-?%d+) ?(%x*)$')
      if not o then o, f, l, r, g = string.match(v, '^(%d) (%-?%d+) (%-?%d+) ?(%d*) ?(%x*)$') end
      if o then t.kept[tonumber(k)] = {open = o == '1', cut = o == '2', first = tonumber(f), latest = tonumber(l), at = tonumber(r) or 0, lm = tonumber(m) or -1, reg = g} end
    end
  end
  if not t.top then return nil end
  return t
end
-- The incarnation has a table (`b`), but it is gone or is not the one last written (`bn`
-- mirrors its `n`): it was lost apart from its incarnation (evicted, failed over). Then the
-- incarnation is lost, never numbered anew.
local function table_lost(inc)
  local f = redis.call('HMGET', ikey(inc), 'b', 'bn')
  if f[1] ~= '1' then return false end
  local n = redis.call('HGET', bkey(inc), 'n')
  return (not n) or (f[2] and f[2] ~= n)
end
local function put_branch(inc, g, b)
  local o = '0'
  if b.open then o = '1' elseif b.cut then o = '2' end
  local reg = ''
  if b.reg and b.reg ~= '' then reg = ' ' .. b.reg end
  redis.call('HSET', bkey(inc), fmt(g), o .. ' ' .. fmt(b.first) .. ' ' .. fmt(b.latest) .. ' ' .. fmt(b.at or 0)
    .. ' m' .. fmt(b.lm or -1) .. reg)
end
-- `abandoned` records that came before their registration (field `a`: "<registration>:<ms>"
-- entries, oldest first), those within registration_grace; and whether the field exists.
local function abandoned_list(inc)
  local raw = redis.call('HGET', bkey(inc), 'a')
  local out = {}
  if not raw then return out, false end
  for r, at in string.gmatch(raw, '(%x+):(%d+)') do
    if now - tonumber(at) <= registration_grace then out[#out + 1] = {r, at} end
  end
  return out, true
end
local function put_abandoned(inc, list)
  if #list == 0 then
    redis.call('HDEL', bkey(inc), 'a')
    return
  end
  local parts = {}
  for i, e in ipairs(list) do parts[i] = e[1] .. ':' .. e[2] end
  redis.call('HSET', bkey(inc), 'a', table.concat(parts, ' '))
end
-- Keep at most kept_branches continuations (branch 0 always stays, and `keep`): the first to
-- go are ended ones, then open ones that never relayed, then the oldest (as the memory store).
local function prune_class(b)
  if not b.open and not b.cut then return 0 end
  if b.open and b.first < 0 then return 1 end
  return 2
end
local function prune(inc, t, keep)
  local n = 0
  for h, _ in pairs(t.kept) do if h >= 1 then n = n + 1 end end
  while n > kept_branches do
    local v, vc = nil, nil
    for h, e in pairs(t.kept) do
      if h >= 1 and h ~= keep then
        local c = prune_class(e)
        if not v or c < vc or (c == vc and h < v) then v, vc = h, c end
      end
    end
    if not v then break end
    t.kept[v] = nil
    redis.call('HDEL', bkey(inc), fmt(v))
    n = n - 1
  end
end
-- Was branch e fed since b was registered (its latest events landed after that)? Unknown times
-- count as since (as the memory store's `fed_since`).
local function fed_since(e, b)
  return e.lm < 0 or not b or e.lm >= b.at
end
-- Would g's end be answered forked now: an open rival that relayed and is newer or was fed
-- since g was registered, or registered within its grace and not relayed yet (as the memory
-- store's `would_fork`)? Its guard's word may be in flight: the end waits for it.
local function would_fork(t, g)
  local b = t.kept[g]
  for h, e in pairs(t.kept) do
    if h >= 1 and h ~= g and e.open then
      if e.first >= 0 then
        if h > g or fed_since(e, b) then return true end
      elseif now - e.at <= registration_grace then
        return true
      end
    end
  end
  return false
end
-- Are branch g's events refused: another open, newer branch relayed after g started, or g was
-- cut? A branch's first events never are, nor an ended branch's, nor those of a branch the
-- table no longer lists (it starts relaying now).
local function overtaken(t, g)
  local b = t.kept[g]
  if not b then return false end
  if b.cut then return true end
  if not b.open or b.first < 0 then return false end
  for h, e in pairs(t.kept) do
    if h > g and e.open and e.latest > b.first then return true end
  end
  return false
end
-- Mark g ended; would it be answered forked (would_fork)? told: the guard asked at the
-- branch's end and tells its client `forked` on a yes: that branch lost a fork, so it is cut
-- (its records give way to the survivor's).
local function end_branch(inc, t, g, told)
  local forked = would_fork(t, g)
  local b = t.kept[g]
  if b and (b.open or (told and forked and not b.cut)) then
    b.open = false
    if told and forked then b.cut = true end
    put_branch(inc, g, b)
  end
  return forked
end
"#;

/// One record. ARGV: base, now, ttl, max_window, max_incarnations, keep_ms, pending_ttl,
/// type, fields… Returns what it wrote to: `a` an opened session, `p` a pending one (no
/// `session_open` yet), `n` nothing (`branch_end`, `abandoned`); for a `session_open`: `o` opened now, `k`
/// already open, `f` refused (no room: ARGV admit was not 1). `events` refused by the arbiter
/// answer `a` or `p`, a space and the rejection's name (`forked`, `replay_mismatch`).
const APPLY: &str = r#"
local max_window = tonumber(ARGV[4])
local max_incs = tonumber(ARGV[5])
local keep_ms = tonumber(ARGV[6])
local pending_ttl = tonumber(ARGV[7])
local typ = ARGV[8]
local result = 'a'

-- Drop the session if it is idle past its TTL (opened) or waited too long for its
-- session_open (pending), exactly as if the sweep had already run, so the outcome never
-- depends on the sweep's timing. Returns: exists, pending.
local function expire_one()
  local s = redis.call('HMGET', skey, 'lu', 'pv')
  if not s[1] then return false, false end
  local limit = ttl
  if s[2] == '1' then limit = pending_ttl end
  if now - tonumber(s[1]) > limit then
    drop_session()
    return false, false
  end
  return true, s[2] == '1'
end

-- The session a record other than session_open writes to: the opened one, or else a pending
-- one (made with state `fresh`, `lu` = when it appeared) that a session_open turns into the
-- session. A session hash gone (evicted, failed over) while its other keys remain comes back
-- pending too: never as a fresh session without its newest-stream marker.
local function session_for_write(fresh)
  local exists, pending = expire_one()
  if not exists then
    redis.call('HSET', skey, 'st', fresh, 'lu', fmt(now), 'tk', '0', 'pv', '1')
    -- Incarnations without their session hash: the hash was lost (evicted, failed over).
    -- Marked half-missing for good: its cursors read records_lost.
    if redis.call('EXISTS', nkey) == 1 then redis.call('HSET', skey, 'hm', '1') end
    pending = true
  elseif not pending then
    if now > tonumber(redis.call('HGET', skey, 'lu')) then
      redis.call('HSET', skey, 'lu', fmt(now))
    end
  end
  if pending then result = 'p' end
  redis.call('PEXPIRE', skey, keep_ms)
  return redis.call('HGET', skey, 'st')
end

local function touch_inc(inc)
  local tk = redis.call('HINCRBY', skey, 'tk', 1)
  redis.call('ZADD', nkey, tk, inc)
  redis.call('HSETNX', ikey(inc), 'h', '0')
  redis.call('PEXPIRE', nkey, keep_ms)
  redis.call('PEXPIRE', ikey(inc), keep_ms)
  redis.call('PEXPIRE', wkey(inc), keep_ms)
  redis.call('PEXPIRE', lkey(inc), keep_ms)
  redis.call('PEXPIRE', bkey(inc), keep_ms)
  return tk
end

-- A recorded event's id part and, when it has one, its digest part (after the last LF).
local function split_recorded(e)
  local id, d = string.match(e, '^(.*)\n(.*)$')
  if id then return id, d end
  return e, nil
end
local function diverges(recorded, new)
  local ri, rd = split_recorded(recorded)
  local ni, nd = split_recorded(new)
  return ri ~= ni or (rd ~= nil and nd ~= nil and rd ~= nd)
end

-- Keep at most `max` recorded events in the session: the least recently recorded incarnations
-- give all theirs up first, the one just written (`current`, the most recently recorded) its
-- oldest last (as the memory store). Their cursors then read `gap`.
local function fit_session(current, max)
  local incs = redis.call('ZRANGE', nkey, 0, -1)
  local lens, total = {}, 0
  for i, x in ipairs(incs) do
    lens[i] = redis.call('HLEN', wkey(x))
    total = total + lens[i]
  end
  for i, x in ipairs(incs) do
    if total <= max then break end
    if lens[i] > 0 then
      if x ~= current then
        redis.call('DEL', wkey(x), lkey(x))
        total = total - lens[i]
      else
        local seqs = redis.call('HKEYS', wkey(x))
        table.sort(seqs, function(a, b) return tonumber(a) < tonumber(b) end)
        local del = {}
        for j = 1, math.min(total - max, #seqs) do del[#del + 1] = seqs[j] end
        chunked('HDEL', wkey(x), del, 1000)
        total = total - #del
      end
    end
  end
end

-- Keep at most max_incs incarnations, dropping the least recently recorded (never `keep`).
local function evict(keep)
  local limit = math.max(max_incs, 1)
  while redis.call('ZCARD', nkey) > limit do
    local c = redis.call('ZRANGE', nkey, 0, 1)
    local victim = c[1]
    if victim == keep then victim = c[2] end
    if not victim then break end
    redis.call('DEL', ikey(victim), wkey(victim), lkey(victim), bkey(victim))
    redis.call('ZREM', nkey, victim)
  end
end

if typ == 'so' then
  -- ARGV: ..., version, admit (1: room was made for a new session).
  local exists, pending = expire_one()
  if exists and not pending then
    result = 'k'
    if now > tonumber(redis.call('HGET', skey, 'lu')) then
      redis.call('HSET', skey, 'lu', fmt(now))
    end
  elseif ARGV[10] ~= '1' then
    return 'f'
  else
    result = 'o'
    if exists then
      -- What landed before the open becomes the session (an end recorded stays: final).
      redis.call('HDEL', skey, 'pv')
      redis.call('HSET', skey, 'lu', fmt(now))
    else
      redis.call('HSET', skey, 'st', 'a', 'lu', fmt(now), 'tk', '0')
    end
    redis.call('PEXPIRE', nkey, keep_ms)
  end
  redis.call('PEXPIRE', skey, keep_ms)
  -- Ended is final: a late SessionOpen does not revive the session.
  if redis.call('HGET', skey, 'st') == 'a' then redis.call('HSET', skey, 'v', ARGV[9]) end
  return result
elseif typ == 'se' then
  local e = ARGV[9]
  local st = session_for_write(e)
  -- Terminated wins over Expired, whichever lands first.
  if st ~= 't' then redis.call('HSET', skey, 'st', e) end
elseif typ == 'st' then
  local inc, kind, owner, epoch, ret, sup = ARGV[9], ARGV[10], ARGV[11], ARGV[12], ARGV[13], ARGV[14]
  -- ARGV[15], the guard's opened_ms, is accepted and ignored: gateways' clocks differ.
  session_for_write('a')
  local tk = touch_inc(inc)
  local ik = ikey(inc)
  local cur = redis.call('HMGET', ik, 'o', 'ow')
  if cur[1] == '1' then
    -- A continuation re-sends StreamOpen: the same owner keeps the epoch it opened in, and
    -- the incarnation keeps its order (a replay never makes it newer).
    if cur[2] ~= owner then redis.call('HSET', ik, 'ow', owner, 'ep', epoch) end
    redis.call('HSET', ik, 'r', ret, 'k', kind)
  else
    redis.call('HSET', ik, 'o', '1', 'k', kind, 'ow', owner, 'ep', epoch, 'r', ret, 'sq', fmt(tk))
  end
  -- ARGV[16]: the JSON-RPC id (raw JSON text), '' when none.
  if ARGV[16] and ARGV[16] ~= '' then redis.call('HSET', ik, 'rq', ARGV[16]) end
  if sup == '1' and kind == 'g' then
    -- The GET stream whose StreamOpen was applied last (the session's own tick) is the newest.
    local q = tonumber(redis.call('HGET', ik, 'sq') or '0')
    local c = redis.call('HMGET', skey, 'gq', 'gi')
    local better = (not c[1]) or q > tonumber(c[1]) or (q == tonumber(c[1]) and inc > c[2])
    if better then redis.call('HSET', skey, 'gq', fmt(q), 'gi', inc) end
  end
  evict(inc)
elseif typ == 'ev' then
  -- ARGV: ..., inc, first_seq, long_kept, branch, n_long, trimmed, max_session_events,
  -- (seq, full id) * n_long, ids...
  local inc = ARGV[9]
  local first = tonumber(ARGV[10])
  local long_kept = tonumber(ARGV[11])
  local branch = tonumber(ARGV[12])
  local n_long = tonumber(ARGV[13])
  local trimmed = tonumber(ARGV[14])
  local max_events = tonumber(ARGV[15])
  local ids_at = 15 + 2 * n_long
  local n = #ARGV - ids_at
  session_for_write('a')
  touch_inc(inc)
  local ik, wk = ikey(inc), wkey(inc)
  local old_head, table_ = 0, nil
  -- Without ids: the owner answered the branch (its response opened). An overtaken branch is
  -- told so either way.
  local f = redis.call('HMGET', ik, 'h', 'b')
  old_head = tonumber(f[1] or '0')
  -- Only an incarnation with a registered continuation is arbitrated (fresh streams: no read).
  if f[2] == '1' then
    if table_lost(inc) then
      redis.call('HSET', ik, 'l', '1')
      return result .. ' table_lost'
    end
    table_ = branches(inc)
  end
  -- The guard cuts an overtaken branch now: it holds the stream no more (another branch's
  -- end must not count it as open), and its later events are refused too.
  local function cut()
    local b = table_.kept[branch]
    if b and not b.cut then
      b.open, b.cut = false, true
      put_branch(inc, branch, b)
    end
    return result .. ' forked'
  end
  if table_ and overtaken(table_, branch) then return cut() end
  if n > 0 then
    -- Seqs at or below the head recorded with another event: the replica diverged from the
    -- log, and the incarnation is lost. Appends past the head read nothing.
    local last = math.min(first + n - 1, old_head)
    local diverged = false
    for lo = first, last, 1000 do
      local fields = {}
      for s = lo, math.min(lo + 999, last) do fields[#fields + 1] = fmt(s) end
      local got = redis.call('HMGET', wk, unpack(fields))
      for i = 1, #fields do
        if got[i] and diverges(got[i], ARGV[ids_at + lo - first + i]) then diverged = true break end
      end
      if diverged then break end
    end
    if diverged then
      -- Two continuations, both open, recorded two ways: the replica feeds two branches two
      -- ways (a fork, not a lost log); the newer one is followed, the older one cut. Against
      -- the first response's records or an ended branch's, it is a divergence.
      local h = table_ and branch >= 1 and table_.writer
      local w = h and h >= 1 and h ~= branch and table_.kept[h]
      if w and w.open then
        if branch < h then return cut() end
      elseif not (w and w.cut) then
        redis.call('HSET', ik, 'l', '1')
        return result .. ' replay_mismatch'
      end
      -- Else the writer lost a fork (cut): its records give way to the survivor's.
    end
  end
  if n_long > 0 then
    local lk = lkey(inc)
    for j = 0, n_long - 1 do
      redis.call('HSET', lk, ARGV[16 + 2 * j], ARGV[17 + 2 * j])
    end
    -- Only the newest long_kept seqs keep their full id.
    local extra = redis.call('HLEN', lk) - long_kept
    if extra > 0 then
      local seqs = redis.call('HKEYS', lk)
      table.sort(seqs, function(a, b) return tonumber(a) < tonumber(b) end)
      for j = 1, extra do redis.call('HDEL', lk, seqs[j]) end
    end
    redis.call('PEXPIRE', lk, keep_ms)
  end
  if trimmed > 0 then
    -- The guard left the seqs before first out on purpose: a hole there never fills.
    local tf = tonumber(redis.call('HGET', ik, 'tf') or '0')
    if first > tf then redis.call('HSET', ik, 'tf', fmt(first)) end
  end
  -- The owner answered for the stream again: an earlier failure passed.
  redis.call('HDEL', ik, 'ff', 'fl')
  if n > 0 then
    local head = math.max(old_head, first + n - 1)
    -- Only the newest max_window seqs are kept: those are the ones a resume can still need.
    local floor = head - max_window + 1
    local pairs_ = {}
    for i = 1, n do
      local seq = first + i - 1
      if seq >= floor then
        pairs_[#pairs_ + 1] = fmt(seq)
        pairs_[#pairs_ + 1] = ARGV[ids_at + i]
      end
    end
    chunked('HSET', wk, pairs_, 1000)
    if head > old_head then
      redis.call('HSET', ik, 'h', fmt(head))
      local old_floor = math.max(old_head - max_window + 1, 0)
      if floor > old_floor then
        local del = {}
        if floor - old_floor > redis.call('HLEN', wk) then
          for _, k in ipairs(redis.call('HKEYS', wk)) do
            if tonumber(k) < floor then del[#del + 1] = k end
          end
        else
          for s = old_floor, floor - 1 do del[#del + 1] = fmt(s) end
        end
        chunked('HDEL', wk, del, 1000)
      end
    end
    redis.call('PEXPIRE', wk, keep_ms)
    fit_session(inc, max_events)
    if table_ then redis.call('HSET', bkey(inc), 'w', fmt(branch)) end
  end
  if table_ then
    -- The branch's relay order (an ended branch keeps its own; a handed-out branch the table
    -- no longer lists comes back, open, relaying from now).
    local b = table_.kept[branch]
    if not b and branch >= 1 and branch <= table_.top then
      b = {open = true, cut = false, first = -1, latest = -1, at = 0, lm = -1}
      table_.kept[branch] = b
      prune(inc, table_, branch)
    end
    if b and b.open then
      local tick = redis.call('HINCRBY', bkey(inc), 't', 1)
      if b.first < 0 then b.first = tick end
      b.latest = tick
      b.lm = now
      put_branch(inc, branch, b)
    end
  end
  evict(inc)
elseif typ == 'be' then
  -- ARGV: ..., inc, branch. A known branch is marked ended; nothing else is written.
  local inc = ARGV[9]
  if table_lost(inc) then
    redis.call('HSET', ikey(inc), 'l', '1')
  elseif redis.call('HGET', ikey(inc), 'b') == '1' then
    local t = branches(inc)
    if t then end_branch(inc, t, tonumber(ARGV[10]), false) end
  end
  return 'n'
elseif typ == 'ab' then
  -- ARGV: ..., inc, registration. Ends the open branch it registered that never relayed, or
  -- remembers it (within abandoned_kept) so its registration is born ended.
  local inc, reg = ARGV[9], ARGV[10]
  if redis.call('HGET', ikey(inc), 'o') ~= '1' or table_lost(inc) then return 'n' end
  local t = nil
  if redis.call('HGET', ikey(inc), 'b') == '1' then t = branches(inc) end
  if t then
    for g, b in pairs(t.kept) do
      if b.reg == reg then
        if b.open and b.first < 0 then
          b.open = false
          put_branch(inc, g, b)
        end
        return 'n'
      end
    end
  end
  local list = abandoned_list(inc)
  for _, e in ipairs(list) do
    if e[1] == reg then return 'n' end
  end
  if #list >= abandoned_kept then table.remove(list, 1) end
  list[#list + 1] = {reg, fmt(now)}
  put_abandoned(inc, list)
  redis.call('PEXPIRE', bkey(inc), keep_ms)
  return 'n'
elseif typ == 'of' then
  session_for_write('a')
  touch_inc(ARGV[9])
  -- The first failure opens the window (repeats never push it back); the latest (`fl`) says
  -- whether failures stood through it.
  redis.call('HSETNX', ikey(ARGV[9]), 'ff', fmt(now))
  local fl = tonumber(redis.call('HGET', ikey(ARGV[9]), 'fl') or '0')
  if now > fl then redis.call('HSET', ikey(ARGV[9]), 'fl', fmt(now)) end
  evict(ARGV[9])
elseif typ == 'sl' then
  session_for_write('a')
  touch_inc(ARGV[9])
  redis.call('HSET', ikey(ARGV[9]), 'l', '1')
  evict(ARGV[9])
else
  return redis.error_reply('unknown record type ' .. tostring(typ))
end
return result
"#;

/// The facts about one cursor, read in one atomic step.
/// ARGV: base, now, ttl, inc, seq, max_expected, max_window, keep_ms, owner failure window.
/// Returns `{0}` (no session), `{4}` (half-missing: records lost), `{state}` (no opened
/// incarnation) or
/// `{state, kind, owner, epoch, lost, superseded, head, retention, retained_from, cursor id
/// code (0 plain, 1 long and kept, 2 long and gone), full cursor id or '', request id or '',
/// trimmed floor (`tf`, 0: none), ids…}`. `state` is
/// 1 active, 2 terminated, 3 expired; plus 10 when Redis refused the last-used write.
const SNAPSHOT: &str = r#"
local inc = ARGV[4]
local seq = tonumber(ARGV[5])
local max_expected = tonumber(ARGV[6])
local max_window = tonumber(ARGV[7])
local keep_ms = tonumber(ARGV[8])
local failure_window = tonumber(ARGV[9])
local sf = redis.call('HMGET', skey, 'lu', 'pv', 'hm')
local lu = sf[1]
-- Half-missing (the hash lost while incarnations remain, or re-created over them): lost,
-- never fresh.
if sf[3] == '1' or (not lu and redis.call('EXISTS', nkey) == 1) then return {4} end
-- Pending (no session_open yet) is not a session yet.
if not lu or sf[2] == '1' then return {0} end
-- Idle past the TTL: reads as expired; the sweep (or the next write) frees it.
if now - tonumber(lu) > ttl then return {3} end
local st = redis.call('HGET', skey, 'st')
local ik, wk, lk, bk = ikey(inc), wkey(inc), lkey(inc), bkey(inc)
local code = 3
if st == 'a' then code = 1 elseif st == 't' then code = 2 end
if st == 'a' then
  -- The touch must never fail the lookup: a Redis at maxmemory refuses the write, and the
  -- verdict is then read-only (code + 10, counted).
  local refused = false
  local function try(...)
    local r = redis.pcall(...)
    if type(r) == 'table' and r.err then refused = true end
  end
  if now > tonumber(lu) then try('HSET', skey, 'lu', fmt(now)) end
  try('PEXPIRE', skey, keep_ms)
  try('PEXPIRE', nkey, keep_ms)
  try('PEXPIRE', ik, keep_ms)
  try('PEXPIRE', wk, keep_ms)
  try('PEXPIRE', lk, keep_ms)
  try('PEXPIRE', bk, keep_ms)
  if refused then code = code + 10 end
end
local f = redis.call('HMGET', ik, 'o', 'k', 'ow', 'ep', 'r', 'sq', 'l', 'h', 'ff', 'rq', 'tf', 'fl')
if f[1] ~= '1' then return {code} end
local kind = f[2]
local head = tonumber(f[8] or '0')
local superseded = 0
if kind == 'g' then
  local c = redis.call('HMGET', skey, 'gq', 'gi')
  local q = tonumber(f[6] or '0')
  if c[1] then
    local cq = tonumber(c[1])
    if cq > q or (cq == q and c[2] > inc) then superseded = 1 end
  end
end
local lost = 0
if f[7] == '1' then lost = 1 end
-- An owner that kept failing through the whole window (a failure at each end, no answer
-- between): lost for good (a refused write changes nothing: the verdict is the same, and the
-- next resume decides again).
if lost == 0 and f[9] and f[12] and tonumber(f[12]) - tonumber(f[9]) > failure_window then
  lost = 1
  redis.pcall('HSET', ik, 'l', '1')
end
-- Contiguity: walk down from head while recorded; the first missing seq is the floor.
local retained_from = 0
local expected = {}
if seq < head then
  local from = seq + 1
  local want = head
  local vals = {}
  local complete = false
  local steps = 0
  while true do
    local lo = math.max(from, want - 255)
    local fields = {}
    for s = want, lo, -1 do fields[#fields + 1] = fmt(s) end
    local got = redis.call('HMGET', wk, unpack(fields))
    local missing = false
    for i = 1, #fields do
      if not got[i] then missing = true break end
      vals[#vals + 1] = got[i]
      want = want - 1
    end
    if missing then break end
    if want < from then complete = true break end
    steps = steps + #fields
    -- Never more than max_window entries exist: the rest cannot be vouched for.
    if steps >= max_window then break end
  end
  if complete then
    for i = #vals, math.max(1, #vals - max_expected + 1), -1 do expected[#expected + 1] = vals[i] end
  else
    retained_from = want + 1
  end
end
local cid_code, cid = 0, ''
local full = redis.call('HGET', lk, fmt(seq))
if full then
  cid_code, cid = 1, full
else
  local rec = redis.call('HGET', wk, fmt(seq))
  if rec and string.sub(rec, 1, 1) == '~' then cid_code = 2 end
end
local out = {code, kind, f[3] or '', f[4] or '0', lost, superseded, head, tonumber(f[5] or '0'), retained_from, cid_code, cid, f[10] or '', tonumber(f[11] or '0')}
for i = 1, #expected do out[#out + 1] = expected[i] end
return out
"#;

/// A continuation's branch. ARGV: base, now, ttl, mode, inc, branch, keep_ms, kept,
/// registration ('' none). `open`: registers the next branch of an opened incarnation (ended
/// from the start when an `abandoned` record for its registration came first) and returns
/// its number (the
/// table, with branch 0, is made by the first), -1 when the incarnation is not opened, -2 when
/// Redis refused the write (maxmemory), -3 when the table was lost apart from the incarnation
/// (now marked lost). `end`: marks `branch` ended; returns 1 when another branch numbered 1 or
/// more is open and relaying, or when the table was lost (the end is signalled), else 0.
/// `settle`: as `end`, but when the answer would be 1 only on account of open branches that
/// never relayed, within their grace, returns 2: the branch is ended, not cut.
const BRANCH: &str = r#"
local mode, inc = ARGV[4], ARGV[5]
local ik, bk = ikey(inc), bkey(inc)
if mode == 'open' then
  local keep_ms, kept = tonumber(ARGV[7]), tonumber(ARGV[8])
  if redis.call('HGET', ik, 'o') ~= '1' then return -1 end
  if table_lost(inc) then
    redis.pcall('HSET', ik, 'l', '1')
    return -3
  end
  -- The first write is the one Redis at maxmemory refuses (later ones in the script are let
  -- through): a refusal is an answer, never a failed resume.
  local top = redis.pcall('HINCRBY', bk, 'n', 1)
  if type(top) == 'table' then return -2 end
  if top == 1 then
    -- Branch 0, the incarnation's first response, relayed from the start.
    redis.call('HSET', bk, 't', '0', '0', '1 0 -1')
    redis.call('HSET', ik, 'b', '1')
  end
  redis.call('HSET', ik, 'bn', fmt(top))
  local state, reg = '1', ARGV[9]
  if reg ~= '' then
    local list, had = abandoned_list(inc)
    if had then
      local rest = {}
      for _, e in ipairs(list) do
        if e[1] == reg then state = '0' else rest[#rest + 1] = e end
      end
      put_abandoned(inc, rest)
    end
    reg = ' ' .. reg
  end
  redis.call('HSET', bk, fmt(top), state .. ' -1 -1 ' .. fmt(now) .. ' m-1' .. reg)
  if top > kept then
    local t = branches(inc)
    if t then prune(inc, t, top) end
  end
  redis.call('PEXPIRE', bk, keep_ms)
  return top
end
-- `settle`: an end whose answer may still turn ends the branch (its replica ended it: it must
-- not overtake the branch that may be reading now) and leaves it uncut.
if mode == 'settle' and redis.call('HGET', ik, 'b') == '1' and not table_lost(inc) then
  local t, g = branches(inc), tonumber(ARGV[6])
  if t and would_fork(t, g) then
    redis.call('HDEL', ik, 'ff', 'fl')
    local b = t.kept[g]
    if b and b.open then
      b.open = false
      put_branch(inc, g, b)
    end
    return 2
  end
end
-- A clean end: the owner answered for the stream (a served continuation), a failure passed.
redis.call('HDEL', ik, 'ff', 'fl')
if redis.call('HGET', ik, 'b') ~= '1' then return 0 end
-- Lost apart from its incarnation: the end cannot be arbitrated, so it is signalled.
if table_lost(inc) then
  redis.call('HSET', ik, 'l', '1')
  return 1
end
local t = branches(inc)
if t and end_branch(inc, t, tonumber(ARGV[6]), true) then return 1 end
return 0
"#;

/// Free one session. ARGV: base, now, ttl, mode. Modes: `free` an opened session idle past
/// `ttl`; `pending` a pending session that appeared more than `ttl` ago; `evict_pending` a
/// pending session at once (the pending cap). Returns `{0}` (gone, or not of that kind any
/// more: off the index), `{1}` (freed) or `{2, last_used}` (alive).
const SWEEP: &str = r#"
local s = redis.call('HMGET', skey, 'lu', 'pv')
local lu = s[1]
if not lu then
  drop_session()
  return {0}
end
local mode = ARGV[4]
if (mode == 'free') == (s[2] == '1') then return {0} end
if mode == 'evict_pending' or now - tonumber(lu) > ttl then
  drop_session()
  return {1}
end
return {2, lu}
"#;

/// `owner_gone`: KEYS[1] the owners hash; ARGV: owner, now. The epoch never goes back, even
/// after an expired entry was forgotten.
const OWNER_GONE: &str = r#"
local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local e = math.max(cur + 1, tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', e))
return 1
"#;

/// The branch rules with the table's bound.
fn branches() -> String {
    format!(
        "local kept_branches = {BRANCHES_KEPT}\nlocal registration_grace = \
         {REGISTRATION_GRACE_MS}\nlocal abandoned_kept = {ABANDONED_KEPT}\n{BRANCHES}"
    )
}

pub fn apply_script() -> String {
    format!("{PRELUDE}{}{APPLY}", branches())
}

pub fn branch_script() -> String {
    format!("{PRELUDE}{}{BRANCH}", branches())
}

pub fn snapshot_script() -> String {
    format!("{PRELUDE}{SNAPSHOT}")
}

pub fn sweep_script() -> String {
    format!("{PRELUDE}{SWEEP}")
}

pub fn owner_gone_script() -> String {
    OWNER_GONE.to_owned()
}
