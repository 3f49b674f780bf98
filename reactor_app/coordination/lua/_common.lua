-- _common.lua — fragment spliced into operation scripts by their include line.
-- Helpers only: the Redis clock, the KEYS split, the reply shape, big-number formatting, key
-- lifetimes.

-- Status codes; the Python side's one table is reactor_app.coordination.scripts.STATUSES
-- (tests/unit/test_coordination.py checks that the two agree, name for name).
local OK, LOCKED, SEMAPHORE_FULL, RATE_LIMITED, PERIOD_MARKED = 0, 1, 2, 3, 4
local ORDERED_WAIT, ORDERED_STALE, CHAIN_FAILED, LOST, NOT_FOUND = 5, 6, 7, 8, 9
local PERIOD_IN_FLIGHT = 10

-- Operation scripts take a list of items (claims, holds, renewals), each naming its Redis keys
-- by count: item.n consecutive KEYS, in list order (a script must get every key it touches in
-- KEYS, one flat list). Gives every item its own slice as item.keys.
local function split_keys(items)
  local offset = 0
  for _, item in ipairs(items) do
    item.keys = {unpack(KEYS, offset + 1, offset + item.n)}
    offset = offset + item.n
  end
end

-- A release that must not happen while a flag is up (an execution's cancel request, read in
-- the release's own round trip: coordination/admission.py, Coordinator.release): the last
-- `count` KEYS are flag keys; the value of the first one set, or nil when none is.
local function raised_flag(count)
  for i = #KEYS - count + 1, #KEYS do
    local value = redis.call('GET', KEYS[i])
    if value then return value end
  end
  return nil
end

-- Every script answers {status, json payload}.
local function reply(status, payload)
  return {status, cjson.encode(payload or {})}
end

-- Redis TIME as {seconds, microseconds, now_us, now_ms}. All time decisions use this clock.
local function redis_now()
  local t = redis.call('TIME')
  local seconds, micros = tonumber(t[1]), tonumber(t[2])
  local now_us = seconds * 1000000 + micros
  return {seconds = seconds, micros = micros, us = now_us, ms = math.floor(now_us / 1000),
          text = string.format('%d.%06d', seconds, micros)}
end

-- Two keys that must live at least until `until_ms` (a semaphore's leases and holders: as long
-- as its longest lease; a rate-limit window's members and running total: a window past the
-- newest member). Their lifetimes are set, `spare_ms` longer than needed, only when the first
-- one's falls short, or when `force` (the second was just made): one PTTL instead of setting
-- both on every call. The two are always set together, so the first stands for both; a key made
-- since has no lifetime (-1) and falls short (docs/coordination.md, "How long a semaphore's keys
-- live", "How long a window's keys live"). Returns the lifetime set (ms), or nil.
local function keep_until(first, second, until_ms, now_ms, spare_ms, force)
  if not force and redis.call('PTTL', first) >= until_ms - now_ms then return nil end
  local keep_ms = until_ms - now_ms + spare_ms
  redis.call('PEXPIRE', first, keep_ms)
  redis.call('PEXPIRE', second, keep_ms)
  return keep_ms
end

-- Lua turns numbers above 1e14 into "1.7e+15" when passing them to redis.call; epoch
-- microseconds need every digit, so format integers explicitly. (cjson.encode keeps only 14
-- significant digits too: a number that may exceed that travels in a reply as int() text.)
local function int(n)
  return string.format('%d', n)
end

-- The FIFO hand-off of a freed lock (release.lua, admit.lua): the head waiter's grant, a
-- member "grant:<waiter id>" of the lock's waiters zset scored -(expiry ms), lasts this long.
-- Long enough for a woken delivery (or a re-enqueued parked one on an idle worker) to come
-- back; short enough that a waiter that vanished only delays the key briefly.
local GRANT_PREFIX = 'grant:'
local HANDOFF_GRANT_MS = 3000
-- A waiter waiting in-process (its id starts with WAITING_PREFIX, Python's
-- coordination.claims.WAITING_PREFIX) is subscribed and wakes within milliseconds of the
-- release naming it: its grant is short, so a waiter that is gone (killed, or whose leaving
-- failed in an outage) holds the free key up only briefly. One that misses it asks again.
local WAITING_PREFIX = 'wait:'
local WAITING_GRANT_MS = 500

-- One waiter, one entry: an execution parked as "<id>" whose next delivery waits in-process
-- asks as "wait:<id>" — the same waiter in its other form. A line never holds both: a waiter
-- registering in one form takes over the other form's place (the earlier score), admission
-- removes both, and a grant to either form is the waiter's (lock_check). Otherwise a parked
-- entry outlives the delivery admitted in the other form, and a later release grants the key
-- to an execution that already ran (docs/coordination.md, "One entry per waiter").
local function other_form(waiter)
  if string.sub(waiter, 1, #WAITING_PREFIX) == WAITING_PREFIX then
    return string.sub(waiter, #WAITING_PREFIX + 1)
  end
  return WAITING_PREFIX .. waiter
end

-- Waiter priority (docs/coordination.md, "Priority and fair sharing"): a line is ordered by
-- score, lowest first; a waiter's score is its registration time in ms (to the µs, so two
-- registrations in one ms keep their order) less PRIORITY_STEP_MS per priority level (the
-- holder's `priority`, default 0). So a higher priority is admitted first, FIFO within one
-- priority — and a priority is worth a bounded head start, never an unbounded one: a waiter
-- of priority p is passed over only by waiters of priority q > p that registered less than
-- (q - p) x PRIORITY_STEP_MS after it (the anti-starvation bound).
local PRIORITY_STEP_MS = 10000

local function waiter_score(now, priority)
  return now.us / 1000 - (tonumber(priority) or 0) * PRIORITY_STEP_MS
end

-- Register `waiter` in `waiters` at `score` unless it (in either form) is there already, where
-- it keeps its place, now under the form that asked last. Entries are kept a day. `score` may
-- be a function, called only for a new entry (a fair line's turn is handed out once).
local function waiter_register(waiters, waiter, score)
  local other = other_form(waiter)
  local earlier = redis.call('ZSCORE', waiters, other)
  if earlier and tonumber(earlier) >= 0 then
    local own = redis.call('ZSCORE', waiters, waiter)
    if own and tonumber(own) < tonumber(earlier) then earlier = own end
    redis.call('ZREM', waiters, other)
    redis.call('ZADD', waiters, earlier, waiter)
  elseif not redis.call('ZSCORE', waiters, waiter) then
    if type(score) == 'function' then score = score() end
    redis.call('ZADD', waiters, score, waiter)
  end
  redis.call('PEXPIRE', waiters, 86400000)
end

-- `waiter` (both forms) leaves `waiters`: it was admitted.
local function waiter_remove(waiters, waiter)
  redis.call('ZREM', waiters, waiter, other_form(waiter))
end

-- The live-holds index (operator listings, docs/operations.md): a lock or semaphore hold is one
-- member "<user key>\0<primitive>\0<owner>" of a zset by acquisition ms, of a zset by key
-- (score 0, so ZRANGEBYLEX finds a key prefix) and of a zset by lease expiry ms (ordering by
-- time left; renewals move it), with the count of semaphore holds in a hash (a lock's count is
-- the by-time zset's size less that: the lock's hot path pays no HINCRBY). It is kept only when
-- the caller passes its four keys: one server's index, or on a cluster the shard of the hold's
-- hash slot (coordination/holds_index.py).
local function hold_member(user_key, primitive, owner)
  return user_key .. '\0' .. primitive .. '\0' .. owner
end

-- The index of a key group whose four index keys start at keys[first], or nil.
local function index_of(keys, first, user_key)
  if not user_key or not keys[first + 3] then return nil end
  return {time = keys[first], keys = keys[first + 1], ttl = keys[first + 2],
          counts = keys[first + 3], key = user_key}
end

local function index_add(index, primitive, owner, at_ms, expiry_ms)
  if not index then return end
  local member = hold_member(index.key, primitive, owner)
  if redis.call('ZADD', index.time, at_ms, member) == 1 and primitive ~= 'lock' then
    redis.call('HINCRBY', index.counts, primitive, 1)
  end
  redis.call('ZADD', index.keys, 0, member)
  redis.call('ZADD', index.ttl, expiry_ms, member)
end

-- A renewed (or re-entered) hold's lease now ends at expiry_ms: move its entry by time left
-- (XX: an entry a concurrent prune removed is not brought back).
local function index_renew(index, primitive, owner, expiry_ms)
  if not index then return end
  redis.call('ZADD', index.ttl, 'XX', expiry_ms, hold_member(index.key, primitive, owner))
end

local function index_remove(index, primitive, owner)
  if not index then return end
  local member = hold_member(index.key, primitive, owner)
  if redis.call('ZREM', index.time, member) == 1 and primitive ~= 'lock' then
    redis.call('HINCRBY', index.counts, primitive, -1)
  end
  redis.call('ZREM', index.keys, member)
  redis.call('ZREM', index.ttl, member)
end

-- The unit of work behind a holder: an execution's step (or its reactor level, step ""), so a
-- period reservation can tell a nested re-entry (another unit, same owner) from the same unit
-- coming back after its earlier delivery died.
local function unit_of(h)
  return (h.execution or '') .. '|' .. (h.step or '')
end
