--[[ primitives/ordered_lock.lua — the ordered lock's part of the general scripts: its `admit`
section is spliced into admit.lua and `release` into release.lua. How, and what a section may
use: docs/architecture.md, "Adding a primitive". ]]

-- @section admit

local function check_ordered(claim)
  local k = ordered_keys(claim.keys)
  -- the line's state in one read (nothing below writes it before the last of them is used)
  local state = redis.call('HMGET', k.state, 'epoch', 'cursor', 'first_failed')
  local epoch = tonumber(state[1] or '0')
  if epoch ~= claim.epoch then
    return nil, refusal(ORDERED_STALE, {nonce = claim.nonce, epoch = epoch, reason = 'epoch'})
  end
  local cursor = tonumber(state[2] or '0')
  if claim.nonce <= cursor then
    return nil, refusal(ORDERED_STALE, {nonce = claim.nonce, epoch = epoch, reason = 'passed'})
  end
  if not claim.assigned_now then
    -- every attempt is a sign of life of a waiting position (a position assigned by this
    -- call was registered, heartbeat and keys' lifetimes included, by ordered_assign); one
    -- registered again (completed out of turn by a chain failure) may make a new zset
    local added = redis.call('ZADD', k.positions, now.ms, claim.nonce)
    ordered_refresh(k, claim.ttl_ms, added == 1)
  end

  local first_failed = tonumber(state[3] or 'nil')
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
  -- gate: a position through its gate, completed if a later claim turns out a skip
  return {k = k, gate = true}
end

local function take_ordered(claim, plan)
  redis.call('HSET', plan.k.state, 'in_flight', claim.nonce)
  return {fresh = true}
end

-- a claim without a position (nonce 0: a direct Step.call) takes the next place in the line
-- here, in the admission's own round trip, instead of in a call of its own before it
local function prepare_ordered(claim)
  if claim.nonce ~= 0 then return nil end
  claim.nonce, claim.epoch = ordered_assign(ordered_keys(claim.keys), holder, claim.ttl_ms, now)
  claim.assigned_now = true
  return {nonce = claim.nonce, epoch = claim.epoch}
end

CHECK['ordered_lock'], TAKE['ordered_lock'] = check_ordered, take_ordered
PREPARE['ordered_lock'] = prepare_ordered
WAITERS_INDEX['ordered_lock'] = 4 -- the waiters zset's place in the claim's keys

-- @section release

local function release_ordered(keys, spec)
  local k = ordered_keys(keys)
  -- the line's state in one read (only this function writes it before the last use)
  local state = redis.call('HMGET', k.state, 'epoch', 'in_flight', 'first_failed')
  local epoch = tonumber(state[1] or '0')
  if epoch ~= spec.epoch then
    table.insert(report.not_held, k.state) -- reset while we held it: nothing of ours remains
    return
  end
  if not terminal then
    if tonumber(state[2] or '0') == spec.nonce then
      redis.call('HDEL', k.state, 'in_flight')
    end
    redis.call('ZADD', k.positions, 'XX', now.ms, spec.nonce)
    ordered_refresh(k, spec.ttl_ms, false)
    return
  end
  if spec.strict and (outcome == 'failure' or outcome == 'rollback') then
    local first_failed = tonumber(state[3] or '0')
    if first_failed == 0 or spec.nonce < first_failed then
      redis.call('HSET', k.state, 'first_failed', spec.nonce)
    end
  end
  local cursor, woken = ordered_complete(k, spec.nonce)
  for _, id in ipairs(woken) do table.insert(report.woken, id) end
  if cursor then
    table.insert(report.advanced, {key = k.state, cursor = cursor})
    table.insert(report.freed, k.state)
  end
  ordered_refresh(k, spec.ttl_ms, false)
end

RELEASE['ordered_lock'] = release_ordered
