--[[ admit.lua — admit N claims all-or-nothing (docs/design.md §2.1).

Claims arrive in admission order (ordered gate, period check, lock, semaphore, rate-limit
charge). Phase 1 checks every claim and writes only housekeeping (purging expired semaphore
leases and rate-limit entries, ordered-lock heartbeats and pass-overs). Phase 2 takes every
claim. So nothing is taken unless everything is, and the rate limit is charged only for work
about to run.

KEYS — one group per claim, in claim order; a claim's group size is its spec's `n`:
  ordered_lock (4): state hash, positions zset (nonce -> heartbeat ms), holders hash
                    (nonce -> holder json), waiters zset (waiter id -> nonce)
  period       (3): done mark hash (bucket = start epoch s, by = execution or owner, at = ms),
                    reservations hash (bucket start s -> json {owner, count, unit, step,
                    execution, reactor, acquired_at ms, expires ms}), waiters zset
  lock       (3+I): hold hash (owner, count, step, execution, reactor, acquired_at ms, token),
                    fence (the last token issued, never expires), waiters zset (waiter id ->
                    registered ms; plus at most one "grant:<waiter id>" -> -(grant expiry ms),
                    see release.lua)
  semaphore  (3+I): leases zset (owner -> lease expiry ms), holders hash (owner -> json
                    {count, step, execution, reactor, acquired_at ms}; and field "\0limit" =
                    the limit of the latest admission, for operators), waiters zset
  I = 0, or 4 with the live-holds index (see _common.lua): by-time zset, by-key zset, by-expiry
  zset, counts
      hash — then the claim's spec carries `ik`, its user key
  rate_limit (1+W+S+T): sequence counter, then per window a zset (sliding: member
                    "<us>-<seq>" or "<us>-<seq>*<cost>" -> admitted us) or a counter (fixed,
                    expiring at the epoch-aligned window end), then (S = 1 when the spec says
                    `stored`) the windows hash (label -> json {seconds, limit, strategy}) for
                    operators, then (sliding: T = W) per window the running-total hash
                    {cost = sum of the members' costs, n = members accounted for}

ARGV[1]  holder json: {owner, execution?, step?, reactor?}
ARGV[2]  claims json, a list in claim order; each {p = primitive, n = key count} plus:
           ordered_lock: nonce, epoch (ms), ppt_ms (poison-pill timeout), strict (bool), ttl_ms
           period:       every ("second".."year" or seconds as text), ttl_ms (reservation lease)
           lock:         ttl_ms, ik? (user key, when the index keys follow)
           semaphore:    limit, ttl_ms (lease), ik?
           rate_limit:   strategy ("sliding" | "fixed"), windows = [{ms, limit, label}],
                         stored? (true: the windows hash key follows the window keys),
                         cost? (units charged to every window, default 1; never above a
                         window's limit — the caller refuses that before admission)
ARGV[3]  waiter id, or "" — on admission it is removed from the waiters of every claim; on a
         refusal by a lock, semaphore, ordered lock or period in flight it is added to that
         claim's waiters, in the same atomic step, so a release can never slip between refusal
         and registration (a waiter already registered keeps its place: waiters are served
         first come, first served). A free lock granted to another waiter by the last release
         is refused too.

Returns {status, json}; every refusal payload has `index` (0-based claim) and `time`:
  0 OK             {time = "s.us", holds = [{fresh, token? (text: µs-sized), bucket?,
                    bucket_end?, member?}]}
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
-- @include _calendar.lua
-- @include _ordered.lua

local now = redis_now()
local holder = cjson.decode(ARGV[1])
local claims = cjson.decode(ARGV[2])
local waiter = ARGV[3] or ''

split_keys(claims)

local function refusal(status, payload, waiters_key, waiter_score)
  payload.status = status
  payload.waiters_key = waiters_key
  payload.waiter_score = waiter_score
  return payload
end

-- ------------------------------------------------------------------ ordered lock

local function check_ordered(claim)
  local k = ordered_keys(claim.keys)
  local epoch = tonumber(redis.call('HGET', k.state, 'epoch') or '0')
  if epoch ~= claim.epoch then
    return nil, refusal(ORDERED_STALE, {nonce = claim.nonce, epoch = epoch, reason = 'epoch'})
  end
  local cursor = ordered_cursor(k)
  if claim.nonce <= cursor then
    return nil, refusal(ORDERED_STALE, {nonce = claim.nonce, epoch = epoch, reason = 'passed'})
  end
  -- every attempt is a sign of life of a waiting position
  redis.call('ZADD', k.positions, now.ms, claim.nonce)
  ordered_touch(k, claim.ttl_ms)

  local first_failed = tonumber(redis.call('HGET', k.state, 'first_failed') or 'nil')
  if claim.strict and first_failed and first_failed < claim.nonce then
    local _, woken = ordered_complete(k, claim.nonce)
    return nil, refusal(CHAIN_FAILED,
      {nonce = claim.nonce, first_failed = first_failed, woken = woken})
  end

  -- pass over dead heads: no registration, or no heartbeat within the poison-pill timeout
  local head = cursor + 1
  local moved = false
  while head < claim.nonce do
    local beat = redis.call('ZSCORE', k.positions, head)
    if beat and now.ms - tonumber(beat) <= claim.ppt_ms then break end
    redis.call('ZREM', k.positions, head)
    redis.call('HDEL', k.holders, head)
    cursor, head, moved = head, head + 1, true
  end
  if moved then
    redis.call('HSET', k.state, 'cursor', cursor)
    -- a dead head may have died while admitted
    if tonumber(redis.call('HGET', k.state, 'in_flight') or '0') <= cursor then
      redis.call('HDEL', k.state, 'in_flight')
    end
  end

  if head < claim.nonce then
    local beat = tonumber(redis.call('ZSCORE', k.positions, head))
    -- come back when the head would count as dead, and at least every third of the timeout
    -- so that this position's own heartbeat stays fresh while it waits
    local retry = math.min(claim.ppt_ms - (now.ms - beat), math.floor(claim.ppt_ms / 3))
    local blocker = redis.call('HGET', k.holders, head)
    return nil, refusal(ORDERED_WAIT, {
      nonce = claim.nonce, last_completed = cursor, head = head,
      retry_after_ms = math.max(retry, 1),
      blocker = blocker and cjson.decode(blocker) or nil,
    }, k.waiters, claim.nonce)
  end
  return {k = k}
end

local function take_ordered(claim, plan)
  redis.call('HSET', plan.k.state, 'in_flight', claim.nonce)
  return {fresh = true}
end

-- ------------------------------------------------------------------ period

local function check_period(claim)
  local start, finish = period_bucket(claim.every, now.seconds)
  if not start then
    return redis.error_reply('unknown period unit: ' .. tostring(claim.every))
  end
  local mark, reserved = claim.keys[1], claim.keys[2]
  local marked = redis.call('HMGET', mark, 'bucket', 'by')
  if marked[1] and tonumber(marked[1]) == start then
    return nil, refusal(PERIOD_MARKED, {marked_by = marked[2], bucket = start, bucket_end = finish})
  end
  local plan = {bucket = start, bucket_end = finish}
  local raw = redis.call('HGET', reserved, int(start))
  if not raw then return plan end
  local entry = cjson.decode(raw)
  if entry.expires <= now.ms then
    -- its holder died (or stalled past its lease): the bucket is free again
    redis.call('HDEL', reserved, int(start))
    return plan
  end
  if entry.owner == holder.owner then
    plan.entry = entry
    return plan
  end
  local left = entry.expires - now.ms
  return nil, refusal(PERIOD_IN_FLIGHT, {
    retry_after_ms = left, bucket = start, bucket_end = finish,
    blocker = {owner = entry.owner, step = entry.step, execution = entry.execution,
               reactor = entry.reactor, since = entry.acquired_at, ttl_ms = left},
  }, claim.keys[3], now.ms)
end

local function take_period(claim, plan)
  local reserved = claim.keys[2]
  local expires = now.ms + claim.ttl_ms
  local unit = unit_of(holder)
  local entry, fresh = plan.entry, true
  if entry and entry.unit ~= unit then
    -- nested re-entry by the same owner: the outermost release decides done or free
    entry.count = (entry.count or 1) + 1
    entry.expires = math.max(entry.expires, expires)
    fresh = false
  else
    -- a new reservation, or this very unit again after its earlier delivery died
    entry = {owner = holder.owner, count = 1, unit = unit, step = holder.step,
             execution = holder.execution, reactor = holder.reactor, acquired_at = now.ms,
             expires = expires}
  end
  redis.call('HSET', reserved, int(plan.bucket), cjson.encode(entry))
  if redis.call('PTTL', reserved) < claim.ttl_ms then
    redis.call('PEXPIRE', reserved, claim.ttl_ms)
  end
  return {fresh = fresh, bucket = plan.bucket, bucket_end = plan.bucket_end}
end

-- ------------------------------------------------------------------ lock

local function check_lock(claim)
  local state, refused = lock_check(claim.keys[1], claim.keys[3], holder.owner, waiter, now.ms)
  if refused then return nil, refusal(LOCKED, refused, claim.keys[3], now.ms) end
  return {state = state}
end

local function take_lock(claim, plan)
  local token = lock_take(claim.keys[1], claim.keys[2], claim.keys[3], holder, claim.ttl_ms,
    now, plan.state, index_of(claim.keys, 4, claim.ik))
  return {fresh = plan.state ~= 'again', token = token}
end

-- ------------------------------------------------------------------ semaphore

local function check_semaphore(claim)
  local leases, holders = claim.keys[1], claim.keys[2]
  -- a crashed holder's slot comes back as soon as its lease lapses
  local expired = redis.call('ZRANGEBYSCORE', leases, '-inf', now.ms)
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', leases, '-inf', now.ms)
    redis.call('HDEL', holders, unpack(expired))
    local index = index_of(claim.keys, 4, claim.ik)
    for _, owner in ipairs(expired) do index_remove(index, 'semaphore', owner) end
  end
  if redis.call('ZSCORE', leases, holder.owner) then return {fresh = false} end
  local held = redis.call('ZCARD', leases)
  if held < claim.limit then return {fresh = true} end
  local first = redis.call('ZRANGE', leases, 0, 0, 'WITHSCORES')
  local info = redis.call('HGET', holders, first[1])
  local blocker = info and cjson.decode(info) or {}
  blocker.owner = first[1]
  blocker.ttl_ms = tonumber(first[2]) - now.ms
  return nil, refusal(SEMAPHORE_FULL, {
    retry_after_ms = math.max(tonumber(first[2]) - now.ms, 1),
    limit = claim.limit, held = held, blocker = blocker,
  }, claim.keys[3], now.ms)
end

local function take_semaphore(claim, plan)
  local leases, holders = claim.keys[1], claim.keys[2]
  local expiry = now.ms + claim.ttl_ms
  local info
  if plan.fresh then
    info = {count = 1, step = holder.step, execution = holder.execution,
            reactor = holder.reactor, acquired_at = now.ms}
  else
    info = cjson.decode(redis.call('HGET', holders, holder.owner) or '{"count":0}')
    info.count = (info.count or 0) + 1
    expiry = math.max(expiry, tonumber(redis.call('ZSCORE', leases, holder.owner)))
  end
  redis.call('ZADD', leases, expiry, holder.owner)
  -- the limit travels with every admission; kept beside the holders so operators see it
  redis.call('HSET', holders, holder.owner, cjson.encode(info), '\0limit', claim.limit)
  local index = index_of(claim.keys, 4, claim.ik)
  if plan.fresh then index_add(index, 'semaphore', holder.owner, now.ms, expiry)
  else index_renew(index, 'semaphore', holder.owner, expiry) end
  -- the keys live as long as the longest lease
  local last = redis.call('ZRANGE', leases, -1, -1, 'WITHSCORES')
  local keep_ms = tonumber(last[2]) - now.ms
  redis.call('PEXPIRE', leases, keep_ms)
  redis.call('PEXPIRE', holders, keep_ms)
  return {fresh = plan.fresh}
end

-- ------------------------------------------------------------------ rate limit

-- the cost a sliding-window member carries: "<us>-<seq>*<cost>", or 1 without "*"
local function member_cost(member)
  local c = string.match(member, '%*(%d+)$')
  return c and tonumber(c) or 1
end

-- the running total of a sliding window after purging its expired members, O(expired); the
-- total is rebuilt from the members (O(n), once) when its member count disagrees with the
-- zset's: the total key expired, or an admission was made without it
local function window_total(name, total_key, cutoff_us, window_ms)
  local stored = redis.call('HMGET', total_key, 'cost', 'n')
  local total, n = tonumber(stored[1]), tonumber(stored[2])
  local expired = redis.call('ZRANGEBYSCORE', name, '-inf', cutoff_us)
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', name, '-inf', cutoff_us)
    if total then
      for _, member in ipairs(expired) do total = total - member_cost(member) end
      n = n - #expired
    end
  end
  local card = redis.call('ZCARD', name)
  if not total or n ~= card then
    total = 0
    for _, member in ipairs(redis.call('ZRANGE', name, 0, -1)) do
      total = total + member_cost(member)
    end
    n = card
  end
  if card == 0 then
    redis.call('DEL', total_key)
  else
    redis.call('HSET', total_key, 'cost', total, 'n', n)
    redis.call('PEXPIRE', total_key, math.ceil(window_ms) + 1)
  end
  return total
end

-- when enough cost has left the window for `need` more units: the oldest members leave first,
-- so walk them in admission order until their costs add up to `need` (O(members walked))
local function departure_us(name, need)
  local start, batch, departed = 0, 128, 0
  while true do
    local entries = redis.call('ZRANGE', name, start, start + batch - 1, 'WITHSCORES')
    if #entries == 0 then return nil end
    for j = 1, #entries, 2 do
      departed = departed + member_cost(entries[j])
      if departed >= need then return tonumber(entries[j + 1]) end
    end
    start = start + batch
  end
end

local function check_rate_limit(claim)
  local worst = nil
  local cost = claim.cost or 1
  local totals = 1 + #claim.windows + (claim.stored and 1 or 0)
  for i, window in ipairs(claim.windows) do
    local name = claim.keys[i + 1]
    local count, retry_us
    if claim.strategy == 'fixed' then
      count = tonumber(redis.call('GET', name) or '0')
      if count + cost > window.limit then
        local ttl = redis.call('PTTL', name)
        retry_us = (ttl > 0 and ttl or 1) * 1000
      end
    else
      local window_us = window.ms * 1000
      -- an entry admitted at t counts while now < t + window
      count = window_total(name, claim.keys[totals + i], int(now.us - window_us), window.ms)
      if count + cost > window.limit then
        -- the entry whose departure leaves room for this cost
        local at = departure_us(name, count + cost - window.limit)
        retry_us = at and (at + window_us - now.us) or window_us
      end
    end
    if retry_us and (not worst or retry_us > worst.retry_us) then
      worst = {retry_us = retry_us, limit = window.limit, label = window.label,
               window_ms = window.ms, count = count}
    end
  end
  if worst then
    return nil, refusal(RATE_LIMITED, {
      retry_after_ms = worst.retry_us / 1000, limit = worst.limit, label = worst.label,
      window_ms = worst.window_ms, count = worst.count, cost = cost,
    })
  end
  return {}
end

-- the limits travel with each admission; keep them beside the counts so operators see them
local function store_windows(claim)
  if not claim.stored then return end
  local name = claim.keys[#claim.windows + 2]
  local longest = 0
  for _, window in ipairs(claim.windows) do
    redis.call('HSET', name, window.label, cjson.encode(
      {seconds = window.ms / 1000, limit = window.limit, strategy = claim.strategy}))
    longest = math.max(longest, window.ms)
  end
  if redis.call('PTTL', name) < longest then redis.call('PEXPIRE', name, math.ceil(longest) + 1) end
end

local function take_rate_limit(claim, plan)
  store_windows(claim)
  local cost = claim.cost or 1
  if claim.strategy == 'fixed' then
    for i, window in ipairs(claim.windows) do
      local name = claim.keys[i + 1]
      redis.call('INCRBY', name, cost)
      if redis.call('PTTL', name) < 0 then
        -- windows are aligned on the epoch, so every process agrees on their edges
        redis.call('PEXPIRE', name, math.max(window.ms - now.ms % window.ms, 1))
      end
    end
    return {fresh = true}
  end
  -- members must be unique even for admissions within one microsecond
  local seq = redis.call('INCR', claim.keys[1])
  local member = int(now.us) .. '-' .. seq
  -- the cost travels in the member, so a purge knows what leaves with it
  if cost ~= 1 then member = member .. '*' .. cost end
  local totals = 1 + #claim.windows + (claim.stored and 1 or 0)
  local longest = 0
  for i, window in ipairs(claim.windows) do
    local name = claim.keys[i + 1]
    redis.call('ZADD', name, int(now.us), member)
    redis.call('PEXPIRE', name, math.ceil(window.ms) + 1)
    -- the check just brought the total up to date (window_total), so it stays exact
    local total_key = claim.keys[totals + i]
    redis.call('HINCRBY', total_key, 'cost', cost)
    redis.call('HINCRBY', total_key, 'n', 1)
    redis.call('PEXPIRE', total_key, math.ceil(window.ms) + 1)
    longest = math.max(longest, window.ms)
  end
  redis.call('PEXPIRE', claim.keys[1], math.ceil(longest) + 1)
  return {fresh = true, member = member}
end

-- ------------------------------------------------------------------ admission

local CHECK = {ordered_lock = check_ordered, period = check_period, lock = check_lock,
               semaphore = check_semaphore, rate_limit = check_rate_limit}
local TAKE = {ordered_lock = take_ordered, period = take_period, lock = take_lock,
              semaphore = take_semaphore, rate_limit = take_rate_limit}
local WAITERS_INDEX = {ordered_lock = 4, lock = 3, semaphore = 3, period = 3}

local plans = {}
local gate = nil -- the ordered position that passed its gate in this call
for i, claim in ipairs(claims) do
  local plan, refused = CHECK[claim.p](claim)
  if refused then
    if refused.status == PERIOD_MARKED and gate then
      local _, woken = ordered_complete(ordered_keys(gate.keys), gate.nonce)
      refused.woken = woken
    end
    if waiter ~= '' and refused.waiters_key then
      -- NX: a waiter refused again keeps its place in the order (FIFO)
      redis.call('ZADD', refused.waiters_key, 'NX', refused.waiter_score, waiter)
      redis.call('PEXPIRE', refused.waiters_key, 86400000)
    end
    local status = refused.status
    refused.status, refused.waiters_key, refused.waiter_score = nil, nil, nil
    refused.index = i - 1
    refused.time = now.text
    return reply(status, refused)
  end
  if plan.err then return plan end -- an error reply from a check
  plans[i] = plan
  if claim.p == 'ordered_lock' then gate = claim end
end

local holds = {}
for i, claim in ipairs(claims) do
  holds[i] = TAKE[claim.p](claim, plans[i])
  local waiters_index = WAITERS_INDEX[claim.p]
  if waiter ~= '' and waiters_index then
    redis.call('ZREM', claim.keys[waiters_index], waiter)
  end
end
return reply(OK, {time = now.text, holds = holds})
