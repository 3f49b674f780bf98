--[[ primitives/lock.lua — the lock's part of the general scripts.

One file per primitive (docs/architecture.md, "Adding a primitive"). The loader
(coordination/scripts.py) splices each section of every file in this folder where an operation
script says ``-- @primitives <section>``: ``admit`` into admit.lua (a check and a take,
registered in CHECK and TAKE, and where a refused claim's waiters zset sits in its keys),
``release`` into release.lua (RELEASE), ``extend`` into extend.lua (EXTEND: renewed leases).
A section runs in the scope of its script — that script's locals (now, holder, waiter, report,
outcome, ...) and the fragments it includes — and receives the keys and spec its header lists.
]]

-- @section admit

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

CHECK['lock'], TAKE['lock'] = check_lock, take_lock
WAITERS_INDEX['lock'] = 3 -- the waiters zset's place in the claim's keys

-- @section release

local function release_lock(keys, spec)
  local state, popped = lock_release(keys[1], keys[2], holder.owner, function() return now.ms end,
    index_of(keys, 3, spec.ik))
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
