-- _ordered.lua — fragment: ordered-lock bookkeeping shared by admit, release and skip.
-- An ordered lock's keys are always passed as the group
--   state (hash: epoch, next = last nonce assigned, cursor = last completed nonce,
--          first_failed, in_flight), positions (zset nonce -> last heartbeat ms),
--   holders (hash nonce -> holder json), waiters (zset waiter id -> nonce).
-- Nonces are dense (1, 2, 3 ... per epoch), so the head is always cursor + 1.

local function ordered_keys(keys)
  return {state = keys[1], positions = keys[2], holders = keys[3], waiters = keys[4]}
end

local function ordered_touch(k, ttl_ms)
  for _, name in ipairs({k.state, k.positions, k.holders, k.waiters}) do
    redis.call('PEXPIRE', name, ttl_ms)
  end
end

-- A line's keys live `ttl_ms` past its last activity. Setting the four lifetimes is four
-- PEXPIREs, the largest share of an ordered lock's commands per admission and release; so a call
-- sets them only when the state's lifetime (one PTTL) is not already within TOUCH_SLACK of
-- `ttl_ms` below it — fallen further short, or longer (another declaration's ttl: the last
-- call's ttl applies, as when every call set it) — and otherwise leaves them
-- (docs/coordination.md, "How long a line lives").
-- The four are always set together, so the state's stands for all of them; a key made without
-- one (a position registered again, a new line) is set in that call (`force`). Read from the
-- key itself, never from a record of what was set, so a writer that sets lifetimes its own way
-- (an older version of this library during a rolling deploy) cannot mislead it. The waiters
-- zset also keeps its own day (waiter_register in _common.lua).
local TOUCH_SLACK = 64

local function ordered_refresh(k, ttl_ms, force)
  if not force then
    local left = redis.call('PTTL', k.state)
    if left <= ttl_ms and left >= ttl_ms - math.floor(ttl_ms / TOUCH_SLACK) then return end
  end
  ordered_touch(k, ttl_ms)
end

local function ordered_cursor(k)
  return tonumber(redis.call('HGET', k.state, 'cursor') or '0')
end

-- Take the next place in the line for `holder` ({owner, execution?, step?, reactor?}; its
-- attribution is stored with the position). The first assignment, or the first after the state
-- expired, starts a new epoch: the Redis time in ms. Returns nonce, epoch.
local function ordered_assign(k, holder, ttl_ms, now)
  local epoch = tonumber(redis.call('HGET', k.state, 'epoch') or '0')
  if epoch == 0 then
    epoch = now.ms
    redis.call('HSET', k.state, 'epoch', epoch, 'next', 0, 'cursor', 0)
  end
  local nonce = redis.call('HINCRBY', k.state, 'next', 1)
  local attribution = {assigned_at = now.ms}
  for field, value in pairs(holder) do attribution[field] = value end
  redis.call('ZADD', k.positions, now.ms, nonce)
  redis.call('HSET', k.holders, nonce, cjson.encode(attribution))
  ordered_refresh(k, ttl_ms, true) -- the positions or holders may be new keys
  return nonce, epoch
end

-- Move the cursor over head positions that have no registration (completed out of turn by a
-- chain-failed skip), then hand the parked waiter of the new head its wake-up.
local function ordered_settle(k, cursor)
  local last_assigned = tonumber(redis.call('HGET', k.state, 'next') or '0')
  while cursor < last_assigned and not redis.call('ZSCORE', k.positions, cursor + 1) do
    cursor = cursor + 1
  end
  redis.call('HSET', k.state, 'cursor', cursor)
  redis.call('ZREMRANGEBYSCORE', k.waiters, '-inf', cursor)
  local woken = redis.call('ZRANGEBYSCORE', k.waiters, cursor + 1, cursor + 1)
  if #woken > 0 then redis.call('ZREM', k.waiters, unpack(woken)) end
  redis.call('PUBLISH', k.state, cjson.encode({primitive = 'ordered_lock', cursor = cursor}))
  return cursor, woken
end

-- A terminal outcome for `nonce`: forget its registration; when it is the head the cursor
-- passes it. Returns the new cursor (or nil when the cursor did not move) and waiters to wake.
local function ordered_complete(k, nonce)
  redis.call('ZREM', k.positions, nonce)
  redis.call('HDEL', k.holders, nonce)
  if tonumber(redis.call('HGET', k.state, 'in_flight') or '0') == nonce then
    redis.call('HDEL', k.state, 'in_flight')
  end
  local cursor = ordered_cursor(k)
  if nonce ~= cursor + 1 then return nil, {} end
  return ordered_settle(k, nonce)
end
