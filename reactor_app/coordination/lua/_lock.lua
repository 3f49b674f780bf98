-- _lock.lua — fragment: the lock's check, take and release, shared by the general scripts
-- (admit.lua, release.lua) and the single-lock fast path (lock_admit.lua, lock_release.lua), so
-- the lock has one set of rules whichever script carries it. Needs _common.lua before it.
--
-- A lock's keys, in this order: hold hash (owner, count, step, execution, reactor, acquired_at
-- ms, token), fence (the last token issued; admission only), waiters zset (waiter id ->
-- registered ms; plus at most one "grant:<waiter id>" -> -(grant expiry ms)); then, optionally,
-- the four live-holds index keys (see index_of in _common.lua).

-- The message a freed lock PUBLISHes on its hold key when no waiter is granted it (constant:
-- encoded once here); a grant's message names its waiter instead (see lock_release).
local LOCK_FREED_MESSAGE = '{"freed":true,"primitive":"lock"}'

-- Can `owner` take the lock? Returns "fresh" (free), "granted" (free, with a hand-off grant
-- that is this waiter's or has lapsed), "again" (re-entry by its owner), or
-- nil plus a refusal {retry_after_ms?, blocker} — the blocker is the holder, or
-- {granted_to, ttl_ms} while a free key is granted to another waiter (FIFO hand-off).
local function lock_check(hold, waiters, owner, waiter, now_ms)
  local current = redis.call('HMGET', hold, 'owner', 'step', 'execution', 'reactor',
    'acquired_at')
  if not current[1] then
    -- a free key handed to the head waiter by the last release: only that waiter may take
    -- it until the grant lapses
    local grant = redis.call('ZRANGEBYSCORE', waiters, '-inf', '(0', 'WITHSCORES', 'LIMIT', 0, 1)
    if grant[1] then
      local until_ms = -tonumber(grant[2])
      -- (either form of the waiter: a parked execution's delivery asks as "wait:<id>")
      if until_ms > now_ms and grant[1] ~= GRANT_PREFIX .. waiter
          and (waiter == '' or grant[1] ~= GRANT_PREFIX .. other_form(waiter)) then
        return nil, {retry_after_ms = until_ms - now_ms,
                     blocker = {granted_to = string.sub(grant[1], #GRANT_PREFIX + 1),
                                ttl_ms = until_ms - now_ms}}
      end
      return 'granted' -- ours, or lapsed: free, and the grant is used up by the take
    end
    return 'fresh'
  end
  if current[1] == owner then return 'again' end
  -- In the hold's last millisecond Redis still has the key while PTTL answers 0: that is
  -- "retry in a moment" (1 ms), not "no lease" — a waiter told nothing would sleep out its
  -- whole wait. Only a hold without an expiry (-1) gives no hint.
  local ttl = redis.call('PTTL', hold)
  local left = ttl ~= -1 and math.max(ttl, 1) or nil
  return nil, {
    retry_after_ms = left,
    blocker = {owner = current[1], step = current[2] or nil, execution = current[3] or nil,
               reactor = current[4] or nil, since = tonumber(current[5]), ttl_ms = left},
  }
end

-- Take the lock checked by lock_check (`state` is its answer); returns the fencing token
-- (text). `h` is the holder {owner, step?, execution?, reactor?, request?}; `index` from
-- index_of. `h.request` (lock_admit.lua: the call's request id, time and freshness) is written
-- into the hold's `request` field, where a resend of the same call finds it.
local function lock_take(hold, fence, waiters, h, ttl_ms, now, state, index)
  if state ~= 'again' then
    -- the hand-off grant (ours, or lapsed) is used up
    if state == 'granted' then redis.call('ZREMRANGEBYSCORE', waiters, '-inf', '(0') end
    -- never below the Redis clock in µs, so a fence lost in a restart cannot issue old
    -- tokens; and above the last token, which the Redis clock nearly always is already (one
    -- SET ... GET then, a second SET only when it is not)
    local token = int(now.us)
    local last = tonumber(redis.call('SET', fence, token, 'GET') or '0')
    if last >= now.us then
      token = int(last + 1)
      redis.call('SET', fence, token)
    end
    redis.call('HSET', hold, 'owner', h.owner, 'count', 1, 'step', h.step or '',
      'execution', h.execution or '', 'reactor', h.reactor or '',
      'acquired_at', now.ms, 'token', token, 'request', h.request or '')
    redis.call('PEXPIRE', hold, ttl_ms)
    index_add(index, 'lock', h.owner, now.ms, now.ms + ttl_ms)
    return token
  end
  -- re-entry by the same owner: one more nesting level, same token; never shorten the lease
  redis.call('HINCRBY', hold, 'count', 1)
  if h.request then redis.call('HSET', hold, 'request', h.request) end
  if redis.call('PTTL', hold) < ttl_ms then
    redis.call('PEXPIRE', hold, ttl_ms)
    index_renew(index, 'lock', h.owner, now.ms + ttl_ms)
  end
  return redis.call('HGET', hold, 'token')
end

-- Hand a free key to the head waiter: pop it, grant it the key for HANDOFF_GRANT_MS (a waiter
-- waiting in-process: WAITING_GRANT_MS) and
-- PUBLISH on the hold key {primitive, freed, to = that waiter, grant_ms} (the message names
-- it, so the other waiters need not wake to ask); without a waiter, a plain "freed" message.
-- `now_ms` is a function (a TIME only when granting). Returns the waiter popped, or nil.
local function lock_hand_on(hold, waiters, now_ms)
  -- a grant sorts first (negative score); an unused one is dropped on the way to the head
  -- waiter (rare: the take of a granted key removes its grant, a leaving waiter its own)
  local popped = redis.call('ZPOPMIN', waiters, 1)
  while popped[1] and tonumber(popped[2]) < 0 do popped = redis.call('ZPOPMIN', waiters, 1) end
  if popped[1] then
    local grant_ms = HANDOFF_GRANT_MS
    if string.sub(popped[1], 1, #WAITING_PREFIX) == WAITING_PREFIX then
      grant_ms = WAITING_GRANT_MS
    end
    redis.call('ZADD', waiters, -(now_ms() + grant_ms), GRANT_PREFIX .. popped[1])
    redis.call('PUBLISH', hold, cjson.encode(
      {primitive = 'lock', freed = true, to = popped[1], grant_ms = grant_ms}))
    return popped[1]
  end
  redis.call('PUBLISH', hold, LOCK_FREED_MESSAGE)
  return nil
end

-- lock_release's answer codes, by lock_release's state
local RELEASE_CODES = {freed = 0, kept = 1, not_held = 2}

-- The Redis clock in ms, as lock_release and lock_hand_on take it (a TIME only when called).
local function redis_now_ms() return redis_now().ms end

-- Release one nesting level of `owner`'s hold; `now_ms` is a function, called (a TIME) only
-- when a waiter is granted the key. `token` (text, or nil/"" to skip the check) is the
-- fencing token of the admission being released: a hold of the same owner under another token
-- is a later acquisition (the owner's hold was force-released and taken again, e.g. by the
-- delivery that took over from a stale one) and is not this release's to free. Returns
-- "not_held" (lapsed, taken over, or re-taken under a newer token), "kept" (still nested) or
-- "freed", and for "freed" the waiter popped (or nil): the release hands the free key on
-- (lock_hand_on), so waiters are served in the order they registered.
local function lock_release(hold, waiters, owner, now_ms, index, token)
  local current = redis.call('HMGET', hold, 'owner', 'count', 'token')
  if current[1] ~= owner then
    index_remove(index, 'lock', owner) -- lapsed: its index entry is stale
    return 'not_held'
  end
  if token and token ~= '' and current[3] ~= token then
    return 'not_held' -- the index entry is the newer hold's: left alone
  end
  if (tonumber(current[2]) or 1) > 1 then
    redis.call('HINCRBY', hold, 'count', -1)
    return 'kept'
  end
  redis.call('DEL', hold)
  index_remove(index, 'lock', owner)
  return 'freed', lock_hand_on(hold, waiters, now_ms)
end
