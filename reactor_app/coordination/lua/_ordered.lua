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
-- sets them only when that moves their end by more than TOUCH_SLACK of `ttl_ms`, and otherwise
-- leaves them (docs/coordination.md, "How long a line lives"). The state's `lasts` field
-- records the end the last setting gave (ms); the rule that keeps it honest: every existing key
-- of the line lives at least until `lasts`. It holds because every setting of lifetimes goes
-- through here and lowers `lasts` when it shortens them, and a key created without one (the
-- admission's re-registration of a position, `ordered_refresh`'s `force`) has its lifetime set
-- in that call. The waiters zset also keeps its own day (waiter_register in _common.lua).
local TOUCH_SLACK = 64

-- Set the line's lifetimes to end at now + ttl_ms when `force` (the call may have created a key)
-- or when `lasts` (the state's field, nil when absent) is not within the slack below that end;
-- record the new end when it is not.
local function ordered_refresh(k, ttl_ms, now_ms, lasts, force)
  local ends = now_ms + ttl_ms
  local recent = lasts ~= nil and lasts <= ends and lasts >= ends - math.floor(ttl_ms / TOUCH_SLACK)
  if recent and not force then return end
  ordered_touch(k, ttl_ms)
  if not recent then redis.call('HSET', k.state, 'lasts', ends) end
end

local function ordered_cursor(k)
  return tonumber(redis.call('HGET', k.state, 'cursor') or '0')
end

-- Take the next place in the line for `holder` ({owner, execution?, step?, reactor?}; its
-- attribution is stored with the position). The first assignment, or the first after the state
-- expired, starts a new epoch: the Redis time in ms. Returns nonce, epoch.
local function ordered_assign(k, holder, ttl_ms, now)
  local state = redis.call('HMGET', k.state, 'epoch', 'lasts')
  local epoch, lasts = tonumber(state[1] or '0'), tonumber(state[2] or 'nil')
  if epoch == 0 then
    epoch, lasts = now.ms, nil
    redis.call('HSET', k.state, 'epoch', epoch, 'next', 0, 'cursor', 0)
  end
  local nonce = redis.call('HINCRBY', k.state, 'next', 1)
  local attribution = {assigned_at = now.ms}
  for field, value in pairs(holder) do attribution[field] = value end
  redis.call('ZADD', k.positions, now.ms, nonce)
  redis.call('HSET', k.holders, nonce, cjson.encode(attribution))
  ordered_refresh(k, ttl_ms, now.ms, lasts, true) -- the positions or holders may be new keys
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
