--[[ admit.lua — admit N claims all-or-nothing (docs/design.md §2.1).

Claims arrive in admission order (ordered gate, period check, lock, semaphore, rate-limit
charge). Phase 1 checks every claim and writes only housekeeping (purging expired semaphore
leases and rate-limit entries, ordered-lock heartbeats and pass-overs). Phase 2 takes every
claim. So nothing is taken unless everything is, and the rate limit is charged only for work
about to run.

KEYS — one group per claim, in claim order; a claim's group size is its spec's `n`:
  ordered_lock (4): state hash, positions zset (nonce -> heartbeat ms), holders hash
                    (nonce -> holder json), waiters zset (waiter id -> nonce)
  period       (1): mark hash (bucket = start epoch s, by = execution or owner, at = ms)
  lock         (3): hold hash (owner, count, step, execution, reactor, acquired_at ms, token),
                    fence counter (never expires), waiters zset (waiter id -> registered ms)
  semaphore    (3): leases zset (owner -> lease expiry ms), holders hash (owner -> json
                    {count, step, execution, reactor, acquired_at ms}), waiters zset
  rate_limit (1+W): sequence counter, then per window a zset (sliding: member -> admitted us)
                    or a counter (fixed, expiring at the epoch-aligned window end)

ARGV[1]  holder json: {owner, execution?, step?, reactor?}
ARGV[2]  claims json, a list in claim order; each {p = primitive, n = key count} plus:
           ordered_lock: nonce, epoch (ms), ppt_ms (poison-pill timeout), strict (bool), ttl_ms
           period:       every ("second".."year" or seconds as text)
           lock:         ttl_ms
           semaphore:    limit, ttl_ms (lease)
           rate_limit:   strategy ("sliding" | "fixed"), windows = [{ms, limit, label}]
ARGV[3]  waiter id, or "" — on admission it is removed from the waiters of every claim; on a
         refusal by a lock, semaphore or ordered lock it is added to that claim's waiters, in
         the same atomic step, so a release can never slip between refusal and registration.

Returns {status, json}; every refusal payload has `index` (0-based claim) and `time`:
  0 OK             {time = "s.us", holds = [{fresh, token?, bucket?, bucket_end?, member?}]}
  1 LOCKED         {retry_after_ms = lock PTTL, blocker = {owner, step, execution, reactor,
                    since = acquired ms, ttl_ms}}
  2 SEMAPHORE_FULL {retry_after_ms = earliest lease expiry - now, limit, held, blocker}
  3 RATE_LIMITED   {retry_after_ms = max over full windows of (oldest counted entry + window
                    - now), limit, label, window_ms, count}
  4 PERIOD_MARKED  {marked_by, bucket (start s), bucket_end (s), woken?}; an ordered position
                    that passed its gate in this call is completed (a skipped step is
                    terminal) and `woken` lists the parked waiters of the next position
  5 ORDERED_WAIT   {nonce, last_completed, head, retry_after_ms, blocker}
  6 ORDERED_STALE  {nonce, epoch, reason = "epoch" | "passed"}: re-assign a position
  7 CHAIN_FAILED   {nonce, first_failed, woken}; strict line stopped, the position is completed
]]

-- @include _common.lua
-- @include _calendar.lua
-- @include _ordered.lua

local now = redis_now()
local holder = cjson.decode(ARGV[1])
local claims = cjson.decode(ARGV[2])
local waiter = ARGV[3] or ''

local offset = 0
for _, claim in ipairs(claims) do
  claim.keys = {}
  for j = 1, claim.n do claim.keys[j] = KEYS[offset + j] end
  offset = offset + claim.n
end

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
  local marked = redis.call('HMGET', claim.keys[1], 'bucket', 'by')
  if marked[1] and tonumber(marked[1]) == start then
    return nil, refusal(PERIOD_MARKED, {marked_by = marked[2], bucket = start, bucket_end = finish})
  end
  return {bucket = start, bucket_end = finish}
end

local function take_period(claim, plan)
  -- marked only by release with outcome "success", for the bucket admitted here
  return {fresh = true, bucket = plan.bucket, bucket_end = plan.bucket_end}
end

-- ------------------------------------------------------------------ lock

local function check_lock(claim)
  local hold = claim.keys[1]
  local current = redis.call('HMGET', hold, 'owner', 'step', 'execution', 'reactor',
    'acquired_at')
  if not current[1] then return {fresh = true} end
  if current[1] == holder.owner then return {fresh = false} end
  local ttl = redis.call('PTTL', hold)
  return nil, refusal(LOCKED, {
    retry_after_ms = ttl > 0 and ttl or nil,
    blocker = {owner = current[1], step = current[2] or nil, execution = current[3] or nil,
               reactor = current[4] or nil, since = tonumber(current[5]),
               ttl_ms = ttl > 0 and ttl or nil},
  }, claim.keys[3], now.ms)
end

local function take_lock(claim, plan)
  local hold, fence = claim.keys[1], claim.keys[2]
  if plan.fresh then
    local token = redis.call('INCR', fence)
    redis.call('HSET', hold, 'owner', holder.owner, 'count', 1, 'step', holder.step or '',
      'execution', holder.execution or '', 'reactor', holder.reactor or '',
      'acquired_at', now.ms, 'token', token)
    redis.call('PEXPIRE', hold, claim.ttl_ms)
    return {fresh = true, token = token}
  end
  -- re-entry by the same owner: one more nesting level, same token; never shorten the lease
  redis.call('HINCRBY', hold, 'count', 1)
  if redis.call('PTTL', hold) < claim.ttl_ms then redis.call('PEXPIRE', hold, claim.ttl_ms) end
  return {fresh = false, token = tonumber(redis.call('HGET', hold, 'token'))}
end

-- ------------------------------------------------------------------ semaphore

local function check_semaphore(claim)
  local leases, holders = claim.keys[1], claim.keys[2]
  -- a crashed holder's slot comes back as soon as its lease lapses
  local expired = redis.call('ZRANGEBYSCORE', leases, '-inf', now.ms)
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', leases, '-inf', now.ms)
    redis.call('HDEL', holders, unpack(expired))
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
  redis.call('HSET', holders, holder.owner, cjson.encode(info))
  -- the keys live as long as the longest lease
  local last = redis.call('ZRANGE', leases, -1, -1, 'WITHSCORES')
  local keep_ms = tonumber(last[2]) - now.ms
  redis.call('PEXPIRE', leases, keep_ms)
  redis.call('PEXPIRE', holders, keep_ms)
  return {fresh = plan.fresh}
end

-- ------------------------------------------------------------------ rate limit

local function check_rate_limit(claim)
  local worst = nil
  for i, window in ipairs(claim.windows) do
    local name = claim.keys[i + 1]
    local count, retry_us
    if claim.strategy == 'fixed' then
      count = tonumber(redis.call('GET', name) or '0')
      if count >= window.limit then
        local ttl = redis.call('PTTL', name)
        retry_us = (ttl > 0 and ttl or 1) * 1000
      end
    else
      local window_us = window.ms * 1000
      -- an entry admitted at t counts while now < t + window
      redis.call('ZREMRANGEBYSCORE', name, '-inf', int(now.us - window_us))
      count = redis.call('ZCARD', name)
      if count >= window.limit then
        -- the entry whose departure brings the count below the limit
        local edge = redis.call('ZRANGE', name, count - window.limit, count - window.limit,
          'WITHSCORES')
        retry_us = tonumber(edge[2]) + window_us - now.us
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
      window_ms = worst.window_ms, count = worst.count,
    })
  end
  return {}
end

local function take_rate_limit(claim, plan)
  if claim.strategy == 'fixed' then
    for i, window in ipairs(claim.windows) do
      local name = claim.keys[i + 1]
      redis.call('INCR', name)
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
  local longest = 0
  for i, window in ipairs(claim.windows) do
    local name = claim.keys[i + 1]
    redis.call('ZADD', name, int(now.us), member)
    redis.call('PEXPIRE', name, math.ceil(window.ms) + 1)
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
local WAITERS_INDEX = {ordered_lock = 4, lock = 3, semaphore = 3}

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
      redis.call('ZADD', refused.waiters_key, refused.waiter_score, waiter)
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
