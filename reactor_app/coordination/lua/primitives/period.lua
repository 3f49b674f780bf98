--[[ primitives/period.lua — the period's part of the general scripts: its `admit` section is
spliced into admit.lua, `release` into release.lua and `extend` into extend.lua. How, and what a
section may use: docs/architecture.md, "Adding a primitive". ]]

-- @section admit

local function check_period(claim)
  local start, finish = period_bucket(claim.every, now.seconds)
  if not start then
    return redis.error_reply('unknown period unit: ' .. tostring(claim.every))
  end
  local mark, reserved = claim.keys[1], claim.keys[2]
  local marked = redis.call('HMGET', mark, 'bucket', 'by', 'unit')
  -- a mark of this very unit's own success (an execution's step, map element or reactor) is
  -- no other run's: its delivery ended before the success was recorded (killed, or cut by a
  -- time limit), and the unit runs again, at least once, as any unit whose record was lost
  -- (docs/coordination.md, "Period"). A call outside an execution has no unit of its own.
  local own = holder.execution ~= nil and marked[3] == unit_of(holder)
  if marked[1] and tonumber(marked[1]) == start and not own then
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

CHECK['period'], TAKE['period'] = check_period, take_period
WAITERS_INDEX['period'] = 3 -- the waiters zset's place in the claim's keys

-- @section release

local function release_period(keys, spec)
  local mark, reserved, waiters = keys[1], keys[2], keys[3]
  local start, finish = spec.bucket, spec.bucket_end
  if not start then start, finish = period_bucket(spec.every, now.seconds) end
  local raw = redis.call('HGET', reserved, int(start))
  local entry = raw and cjson.decode(raw) or nil
  local ours = entry ~= nil and entry.owner == holder.owner
  if ours and (entry.count or 1) > 1 then
    -- a nested hold: the outermost release decides done or free
    entry.count = entry.count - 1
    redis.call('HSET', reserved, int(start), cjson.encode(entry))
    return
  end
  if ours then
    redis.call('HDEL', reserved, int(start))
  else
    -- lapsed and possibly reserved by another since (its lease was lost)
    table.insert(report.not_held, mark)
  end
  local done = false
  -- a bucket that is over needs no mark, and a newer bucket's mark must never be replaced;
  -- nor this bucket's mark by a holder whose reservation is gone (it lapsed, or a restarted
  -- Redis lost it) when another holder marked the bucket meanwhile: that one's success is the
  -- bucket's, and this release reports the hold as not held, not as a second mark. The same
  -- while another holder's reservation is live: its release will mark the bucket or free it,
  -- and a mark now would make its success the bucket's second
  local overtaken = entry ~= nil and not ours and entry.expires > now.ms
  if outcome == 'success' and now.seconds < finish and not overtaken then
    local current = tonumber(redis.call('HGET', mark, 'bucket') or '-1')
    if current < start or (current == start and ours) then
      redis.call('HSET', mark, 'bucket', start, 'by', holder.execution or holder.owner,
        'unit', holder.execution and unit_of(holder) or '', 'at', now.ms)
      redis.call('PEXPIREAT', mark, int(finish * 1000))
      table.insert(report.marked, mark)
      done = true
    end
  end
  if not ours then return end
  redis.call('PUBLISH', reserved, cjson.encode({primitive = 'period', freed = true, done = done}))
  if done then
    -- every waiter of this bucket skips now
    for _, id in ipairs(redis.call('ZRANGE', waiters, 0, -1)) do
      table.insert(report.woken, id)
    end
    redis.call('DEL', waiters)
  else
    local popped = redis.call('ZPOPMIN', waiters, 1)
    if popped[1] then table.insert(report.woken, popped[1]) end
  end
  table.insert(report.freed, mark)
end

RELEASE['period'] = release_period

-- @section extend

local function extend_period(keys, item)
  local reserved = keys[1]
  local raw = redis.call('HGET', reserved, int(item.bucket))
  if not raw then return 'released' end
  local entry = cjson.decode(raw)
  if entry.owner ~= item.owner then return 'owner' end
  if entry.expires <= now.ms then return 'expired' end
  entry.expires = math.max(entry.expires, now.ms + item.ttl_ms)
  redis.call('HSET', reserved, int(item.bucket), cjson.encode(entry))
  local left = entry.expires - now.ms
  if redis.call('PTTL', reserved) < left then redis.call('PEXPIRE', reserved, left) end
  return nil, left
end

EXTEND['period'] = extend_period
