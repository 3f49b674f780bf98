--[[ admit.lua — admit N claims all-or-nothing (docs/design.md §2.1).

Each primitive's check and take is the `admit` section of its own file, lua/primitives/<name>.lua,
spliced in at the `-- @primitives admit` line below (coordination/scripts.py).

Claims arrive in admission order (ordered gate, period check, lock, semaphore, rate-limit
charge). Phase 1 checks every claim and writes only housekeeping (purging expired semaphore
leases and rate-limit entries, ordered-lock heartbeats and pass-overs). Phase 2 takes every
claim. So nothing is taken unless everything is, and the rate limit is charged only for work
about to run.

KEYS — one group per claim, in claim order; a claim's group size is its spec's `n`:
  ordered_lock (4): state hash, positions zset (nonce -> heartbeat ms), holders hash
                    (nonce -> holder json), waiters zset (waiter id -> nonce)
  period       (3): done mark hash (bucket = start epoch s, by = execution or owner, unit =
                    the marking unit, at = ms),
                    reservations hash (bucket start s -> json {owner, count, unit, step,
                    execution, reactor, acquired_at ms, expires ms}), waiters zset
  lock       (3+I): hold hash (owner, count, step, execution, reactor, acquired_at ms, token),
                    fence (the last token issued, never expires), waiters zset (waiter id ->
                    registered ms; plus at most one "grant:<waiter id>" -> -(grant expiry ms),
                    see release.lua)
  semaphore  (3+F+I): leases zset (owner -> lease expiry ms), holders hash (owner -> json
                    {count, step, execution, reactor, acquired_at ms, lease = µs text}; and
                    field "\0limit" = the limit of the latest admission, for operators),
                    waiters zset (plus hand-off grants, see _semaphore.lua), then (F = 1 when
                    the spec says `fair`) the fair hash (group -> next turn)
  I = 0, or 4 with the live-holds index (see _common.lua): by-time zset, by-key zset, by-expiry
  zset, counts
      hash — then the claim's spec carries `ik`, its user key
  rate_limit (1+W+S+T): sequence counter, then per window a zset (sliding: member
                    "<us>-<seq>" or "<us>-<seq>*<cost>" -> admitted us) or a counter (fixed,
                    expiring at the epoch-aligned window end), then (S = 1 when the spec says
                    `stored`) the windows hash (label -> json {seconds, limit, strategy}) for
                    operators, then (sliding: T = W) per window the running-total hash
                    {cost = sum of the members' costs, n = members accounted for}

ARGV[1]  holder json: {owner, execution?, step?, reactor?, priority? (a waiter's place in a
         line: waiter_score in _common.lua)}
ARGV[2]  claims json, a list in claim order; each {p = primitive, n = key count} plus:
           ordered_lock: nonce, epoch (ms), ppt_ms (poison-pill timeout), strict (bool), ttl_ms;
                         nonce 0: no position yet — one is assigned in this call, before
                         any check, and kept whatever the answer (see `assigned` below)
           period:       every ("second".."year" or seconds as text), ttl_ms (reservation lease)
           lock:         ttl_ms, ik? (user key, when the index keys follow)
           semaphore:    limit, ttl_ms (lease), ik?, fair? (the waiter's fair_by group)
           rate_limit:   strategy ("sliding" | "fixed"), windows = [{ms, limit, label}],
                         stored? (true: the windows hash key follows the window keys),
                         cost? (units charged to every window, default 1; never above a
                         window's limit — the caller refuses that before admission)
ARGV[3]  waiter id, or "" — on admission it is removed (in both its forms: "<id>" parked,
         "wait:<id>" waiting in-process; see other_form in _common.lua) from the waiters of
         every claim; on a
         refusal by a lock, semaphore, ordered lock or period in flight it is added to that
         claim's waiters, in the same atomic step, so a release can never slip between refusal
         and registration (a waiter already registered keeps its place: waiters are served
         in their line's order — first come, first served, within a priority; by turns
         across fair groups). A free lock or semaphore slot granted to another waiter by the
         last release is refused too.

Returns {status, json}; every refusal payload has `index` (0-based claim) and `time`; every
payload has `assigned` = [{index, nonce, epoch}] when ordered positions were assigned in this
call (nonce 0 in the spec), so one round trip both takes a place in the line and tries it:
  0 OK             {time = "s.us", holds = [{fresh, token? (text: µs-sized), bucket?,
                    bucket_end?, member?, lease? (a semaphore's acquisition, text)}],
                    woken? (waiters granted a semaphore's free slots, _semaphore.lua's
                    semaphore_fill: also on a refusal, where the call made any grants)}
  1 LOCKED         {retry_after_ms = lock PTTL, blocker = {owner, step, execution, reactor,
                    since = acquired ms, ttl_ms}}; or, for a free key granted to its head
                    waiter, {retry_after_ms = grant left, blocker = {granted_to, ttl_ms}}
  2 SEMAPHORE_FULL {retry_after_ms = earliest lease expiry - now, limit, held, blocker}
  3 RATE_LIMITED   {retry_after_ms = max over full windows of (admission time of the entry
                    whose departure leaves room for `cost` + window - now), limit, label,
                    window_ms, count (units charged in that window), cost}
  4 PERIOD_MARKED  {marked_by, bucket (start s), bucket_end (s), woken?}; an ordered position
                    that passed its gate in this call is completed (a skipped step is
                    terminal) and `woken` lists the parked waiters of the next position
  5 ORDERED_WAIT   {nonce, last_completed, head, retry_after_ms, blocker}
  6 ORDERED_STALE  {nonce, epoch, reason = "epoch" | "passed"}: re-assign a position
  7 CHAIN_FAILED   {nonce, first_failed, woken}; strict line stopped, the position is completed
 10 PERIOD_IN_FLIGHT {retry_after_ms = the reservation's lease left, bucket, bucket_end,
                    blocker = {owner, step, execution, reactor, since = reserved ms, ttl_ms}}

Period: admission reserves the current bucket for the holder (an in-flight entry with a lease
of ttl_ms, renewed by extend.lua); release.lua marks it done on success and frees it otherwise.
An entry whose lease lapsed (a dead holder) is purged here and the bucket is free again. The
same owner re-enters its own reservation (one more nesting level) from another unit of work;
the same unit (execution + step) finding its own entry takes it over (count 1), since its
earlier delivery is dead: one execution never runs one unit twice at once.

Lock tokens: token = max(last token + 1, Redis TIME in µs), so a fence key lost with every
other key (restart without persistence, failover to a lagging replica) still issues tokens
above every earlier one, as long as the Redis clock has not gone back by more than the outage.
See docs/coordination.md "Guarantees".
]]

-- @include _common.lua
-- @include _lock.lua
-- @include _semaphore.lua
-- @include _calendar.lua
-- @include _ordered.lua

-- The call's own values: declared here, before the functions that read them, and set for each
-- call after the `-- @per_call` line. The Functions library runs everything above that line
-- once, when it loads (lua/_library.lua); an EVALSHA script runs all of it on every call.
local now, holder, claims, waiter
-- waiters a semaphore's free slots were granted to in this call (semaphore_fill): reported as
-- `woken`, so the caller re-enqueues the parked ones
local filled

local function refusal(status, payload, waiters_key, score)
  payload.status = status
  payload.waiters_key = waiters_key
  payload.waiter_score = score
  return payload
end

-- ------------------------------------------------------------------ the primitives

-- each primitive's check and take (lua/primitives/<name>.lua), by primitive name
local CHECK, TAKE, WAITERS_INDEX = {}, {}, {}
-- what a claim sets up before any check, reported whatever the answer (an ordered position
-- assigned in this call: the caller keeps it for its next attempt and its release)
local PREPARE = {}

-- @primitives admit

-- ------------------------------------------------------------------ admission

-- @per_call
now = redis_now()
holder = cjson.decode(ARGV[1])
claims = cjson.decode(ARGV[2])
waiter = ARGV[3] or ''
filled = {}
split_keys(claims)

local assigned = {} -- {index (0-based claim), ...} of what PREPARE set up, for the reply
for i, claim in ipairs(claims) do
  local prepare = PREPARE[claim.p]
  local prepared = prepare and prepare(claim)
  if prepared then
    prepared.index = i - 1
    assigned[#assigned + 1] = prepared
  end
end
if #assigned == 0 then assigned = nil end -- absent from the reply (cjson: {} is not a list)

local plans = {}
local gate = nil -- the ordered position that passed its gate in this call
for i, claim in ipairs(claims) do
  local plan, refused = CHECK[claim.p](claim)
  if refused then
    -- what the claims that passed left to their take (a rate limit's running totals)
    for j = 1, i - 1 do
      if plans[j].on_refused then plans[j].on_refused() end
    end
    if refused.status == PERIOD_MARKED and gate then
      local _, woken = ordered_complete(ordered_keys(gate.keys), gate.nonce)
      refused.woken = woken
    end
    if waiter ~= '' and refused.waiters_key then
      -- a waiter refused again keeps its place in the order (FIFO), in either form
      waiter_register(refused.waiters_key, waiter, refused.waiter_score)
    end
    if #filled > 0 and not refused.woken then refused.woken = filled end
    local status = refused.status
    refused.status, refused.waiters_key, refused.waiter_score = nil, nil, nil
    refused.index = i - 1
    refused.time = now.text
    refused.assigned = assigned
    return reply(status, refused)
  end
  if plan.err then return plan end -- an error reply from a check
  plans[i] = plan
  if plan.gate then gate = claim end
end

local holds = {}
for i, claim in ipairs(claims) do
  holds[i] = TAKE[claim.p](claim, plans[i])
  local waiters_index = WAITERS_INDEX[claim.p]
  if waiter ~= '' and waiters_index then
    waiter_remove(claim.keys[waiters_index], waiter)
  end
end
if #filled == 0 then filled = nil end -- absent from the reply (cjson: {} is not a list)
return reply(OK, {time = now.text, holds = holds, assigned = assigned, woken = filled})
