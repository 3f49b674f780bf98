--[[ primitives/semaphore.lua — the semaphore's part of the general scripts: its `admit` section
is spliced into admit.lua, `release` into release.lua and `extend` into extend.lua. How, and
what a section may use: docs/architecture.md, "Adding a primitive". ]]

-- @section admit

-- a fair claim's fourth key is its fair hash (_semaphore.lua); the index keys follow
local function semaphore_index(claim)
  return index_of(claim.keys, claim.fair and 5 or 4, claim.ik)
end

local function check_semaphore(claim)
  local leases, holders = claim.keys[1], claim.keys[2]
  -- a crashed holder's slot comes back as soon as its lease lapses
  local expired = redis.call('ZRANGEBYSCORE', leases, '-inf', now.ms)
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', leases, '-inf', now.ms)
    redis.call('HDEL', holders, unpack(expired))
    local index = semaphore_index(claim)
    for _, owner in ipairs(expired) do index_remove(index, 'semaphore', owner) end
  end
  if redis.call('ZSCORE', leases, holder.owner) then return {fresh = false} end
  local held = redis.call('ZCARD', leases)
  local waiters = claim.keys[3]
  -- a waiter's place: its turn in a fair line (the fair hash is the claim's fourth key), else
  -- its registration time, both less its priority (_common.lua, _semaphore.lua)
  local score = waiter_score(now, holder.priority)
  if claim.fair then
    score = function() return fair_score(waiters, claim.keys[4], claim.fair,
      holder.priority) end
  end
  if held < claim.limit then
    -- free slots, less those a release handed to waiters (their grants) unless one is ours
    local mine, others, soonest = semaphore_grants(waiters, waiter, now.ms)
    local free = claim.limit - held - others
    if mine then
      -- a granted waiter coming in: slots still free beyond its own (a limit raised since the
      -- release granted it) go on to the next in line
      if free > 1 then semaphore_fill(leases, waiters, free - 1, waiter, now.ms, filled) end
      return {fresh = true, grant = mine}
    end
    if free > 0 then
      -- slots nobody was handed (a raised limit...): the line's first waiters get them
      local my_turn, spare = semaphore_fill(leases, waiters, free, waiter, now.ms, filled)
      if my_turn or spare > 0 then return {fresh = true} end
      mine, others, soonest = semaphore_grants(waiters, waiter, now.ms)
    end
    return nil, refusal(SEMAPHORE_FULL, {
      retry_after_ms = math.max(soonest.left_ms, 1), limit = claim.limit, held = held,
      blocker = {granted_to = soonest.to, ttl_ms = soonest.left_ms},
    }, waiters, score)
  end
  local first = redis.call('ZRANGE', leases, 0, 0, 'WITHSCORES')
  local info = redis.call('HGET', holders, first[1])
  local blocker = info and cjson.decode(info) or {}
  blocker.owner = first[1]
  blocker.ttl_ms = tonumber(first[2]) - now.ms
  return nil, refusal(SEMAPHORE_FULL, {
    retry_after_ms = math.max(tonumber(first[2]) - now.ms, 1),
    limit = claim.limit, held = held, blocker = blocker,
  }, waiters, score)
end

local function take_semaphore(claim, plan)
  local leases, holders = claim.keys[1], claim.keys[2]
  local expiry = now.ms + claim.ttl_ms
  local info
  if plan.grant then redis.call('ZREM', claim.keys[3], plan.grant) end -- the hand-off used up
  if plan.fresh then
    -- `lease` names this acquisition (the Redis clock in µs, as text: cjson keeps only 14
    -- digits of a number), so the release and the renewal of an earlier acquisition by the
    -- same owner — force-released since, e.g. a stale delivery's — leave this one alone
    info = {count = 1, step = holder.step, execution = holder.execution,
            reactor = holder.reactor, acquired_at = now.ms, lease = int(now.us)}
  else
    info = cjson.decode(redis.call('HGET', holders, holder.owner) or '{"count":0}')
    info.count = (info.count or 0) + 1
    expiry = math.max(expiry, tonumber(redis.call('ZSCORE', leases, holder.owner)))
  end
  redis.call('ZADD', leases, expiry, holder.owner)
  -- the limit travels with every admission; kept beside the holders so operators see it
  redis.call('HSET', holders, holder.owner, cjson.encode(info), '\0limit', claim.limit)
  local index = semaphore_index(claim)
  if plan.fresh then index_add(index, 'semaphore', holder.owner, now.ms, expiry)
  else index_renew(index, 'semaphore', holder.owner, expiry) end
  -- the keys live as long as the longest lease: every write of a lease keeps them so, so this
  -- one's is all there is to cover (a quarter of a lease more, spared by the next admissions)
  keep_until(leases, holders, expiry, now.ms, math.floor(claim.ttl_ms / 4))
  return {fresh = plan.fresh, lease = info.lease}
end

CHECK['semaphore'], TAKE['semaphore'] = check_semaphore, take_semaphore
WAITERS_INDEX['semaphore'] = 3 -- the waiters zset's place in the claim's keys

-- @section release

local function release_semaphore(keys, spec)
  local leases, holders, waiters = keys[1], keys[2], keys[3]
  local index = index_of(keys, 4, spec.ik)
  if not redis.call('ZSCORE', leases, holder.owner) then
    table.insert(report.not_held, leases)
    index_remove(index, 'semaphore', holder.owner)
    return
  end
  local info = cjson.decode(redis.call('HGET', holders, holder.owner) or '{"count":1}')
  if spec.lease and info.lease and spec.lease ~= info.lease then
    -- the owner's slot under another lease: a later acquisition (this one was force-released
    -- and the owner took a slot again), not this release's; its index entry stays too
    table.insert(report.not_held, leases)
    return
  end
  info.count = (info.count or 1) - 1
  if info.count > 0 then
    redis.call('HSET', holders, holder.owner, cjson.encode(info))
    return
  end
  redis.call('ZREM', leases, holder.owner)
  redis.call('HDEL', holders, holder.owner)
  index_remove(index, 'semaphore', holder.owner)
  if spec.limit then
    -- a named limit, as it is now: the line gets every slot free under it, in its order (one
    -- raised live frees more than this one); none when it was lowered below the slots still
    -- held — the freed slot is nobody's to take yet, and a waiter woken only to be refused
    -- would lose its place
    local _, grants = semaphore_grants(waiters, '', now.ms)
    local live = redis.call('ZCOUNT', leases, '(' .. int(now.ms), '+inf')
    local granted = {}
    if spec.limit - live - grants > 0 then
      semaphore_fill(leases, waiters, spec.limit - live - grants, '', now.ms, granted)
    end
    if #granted == 0 then redis.call('PUBLISH', leases, SEMAPHORE_FREED_MESSAGE) end
    for _, to in ipairs(granted) do table.insert(report.woken, to) end
  else
    -- the slot goes to the head waiter (a hand-off grant, _semaphore.lua)
    local granted = semaphore_hand_on(leases, waiters, now.ms)
    if granted then table.insert(report.woken, granted) end
  end
  table.insert(report.freed, leases)
end

RELEASE['semaphore'] = release_semaphore

-- @section extend

local function extend_semaphore(keys, item)
  local leases, holders = keys[1], keys[2]
  local expiry = redis.call('ZSCORE', leases, item.owner)
  if not expiry then return 'released' end
  if tonumber(expiry) <= now.ms then return 'expired' end
  if item.lease then
    -- the owner's slot under another lease was taken after this one was force-released
    local info = redis.call('HGET', holders, item.owner)
    local lease = info and cjson.decode(info).lease
    if lease and lease ~= item.lease then return 'token' end
  end
  local renewed = math.max(tonumber(expiry), now.ms + item.ttl_ms)
  redis.call('ZADD', leases, 'XX', renewed, item.owner)
  if renewed ~= tonumber(expiry) then
    index_renew(index_of(keys, 3, item.ik), 'semaphore', item.owner, renewed)
  end
  keep_until(leases, holders, renewed, now.ms, math.floor(item.ttl_ms / 4))
  return nil, renewed - now.ms
end

EXTEND['semaphore'] = extend_semaphore
