--[[ primitives/lock.lua — the lock's part of the general scripts: its `admit` section is
spliced into admit.lua, `release` into release.lua and `extend` into extend.lua. How, and what a
section may use: docs/architecture.md, "Adding a primitive". ]]

-- @section admit

local function check_lock(claim)
  local state, refused = lock_check(claim.keys[1], claim.keys[3], holder.owner, waiter, now.ms)
  if refused then
    return nil, refusal(LOCKED, refused, claim.keys[3], waiter_score(now, holder.priority))
  end
  return {state = state}
end

local function take_lock(claim, plan)
  local token = lock_take(claim.keys[1], claim.keys[2], claim.keys[3], holder, claim.ttl_ms,
    now, plan.state, index_of(claim.keys, 4, claim.ik))
  return {fresh = plan.state ~= 'again', token = token}
end

CHECK['lock'], TAKE['lock'] = check_lock, take_lock
WAITERS_INDEX['lock'] = 3 -- the waiters zset's place in the claim's keys

-- @section release

local function release_lock(keys, spec)
  local state, popped = lock_release(keys[1], keys[2], holder.owner, function() return now.ms end,
    index_of(keys, 3, spec.ik), spec.token)
  if state == 'not_held' then table.insert(report.not_held, keys[1])
  elseif state == 'freed' then
    if popped then table.insert(report.woken, popped) end
    table.insert(report.freed, keys[1])
  end
end

RELEASE['lock'] = release_lock

-- @section extend

local function extend_lock(keys, item)
  local current = redis.call('HMGET', keys[1], 'owner', 'token')
  if not current[1] then return 'released' end
  if current[1] ~= item.owner then return 'owner' end
  if tonumber(current[2]) ~= item.token then return 'token' end
  local ttl = redis.call('PTTL', keys[1])
  if ttl < item.ttl_ms then
    redis.call('PEXPIRE', keys[1], item.ttl_ms)
    ttl = item.ttl_ms
    index_renew(index_of(keys, 2, item.ik), 'lock', item.owner, now.ms + ttl)
  end
  return nil, ttl
end

EXTEND['lock'] = extend_lock
