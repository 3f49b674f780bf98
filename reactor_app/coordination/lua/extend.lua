--[[ extend.lua — renew leases still owned by their holder (the auto-extend thread, §2.6).

A lock is renewed only while its hash still names this owner AND this fencing token: a lock
that lapsed and was taken again, even by the same owner, is reported lost. A semaphore lease and
a period reservation are renewed only while they exist, name this owner and have not expired.
A renewed lease never gets shorter.

KEYS — one group per item, in the order of ARGV[1]:
  lock      (1+I): hold hash
  semaphore (2+I): leases zset (owner -> lease expiry ms), holders hash
  period    (1): reservations hash (bucket start s -> json {owner, count, ..., expires ms})
  I = 0, or 4 with the live-holds index (_common.lua): a renewed lease moves the hold's entry
  in the by-expiry zset
ARGV[1]  items json: [{p = "lock" | "semaphore" | "period", n = key count, owner,
                       ik? (locks, semaphores: the user key, when the index keys follow),
                       token? (locks), bucket? (periods: the reserved bucket's start, epoch s),
                       ttl_ms (the lease to grant from now; 0 = only check that the hold is
                       still ours, leaving its lease as it is)}]

Returns {status, json}:
  0 OK    {extended = [item indexes, 0-based], ttl_ms = [lease left per extended item]}
  8 LOST  {lost = [{index, reason = "released" | "owner" | "token" | "expired"}],
           extended = [...]} — the other items were still renewed
]]

-- @include _common.lua

local now = redis_now()
local items = cjson.decode(ARGV[1])
local extended, granted, lost = {}, {}, {}

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

local function extend_semaphore(keys, item)
  local leases, holders = keys[1], keys[2]
  local expiry = redis.call('ZSCORE', leases, item.owner)
  if not expiry then return 'released' end
  if tonumber(expiry) <= now.ms then return 'expired' end
  local renewed = math.max(tonumber(expiry), now.ms + item.ttl_ms)
  redis.call('ZADD', leases, 'XX', renewed, item.owner)
  if renewed ~= tonumber(expiry) then
    index_renew(index_of(keys, 3, item.ik), 'semaphore', item.owner, renewed)
  end
  local last = redis.call('ZRANGE', leases, -1, -1, 'WITHSCORES')
  local keep_ms = tonumber(last[2]) - now.ms
  redis.call('PEXPIRE', leases, keep_ms)
  redis.call('PEXPIRE', holders, keep_ms)
  return nil, renewed - now.ms
end

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

split_keys(items)
for i, item in ipairs(items) do
  local keys = item.keys
  local reason, ttl
  if item.p == 'lock' then reason, ttl = extend_lock(keys, item)
  elseif item.p == 'period' then reason, ttl = extend_period(keys, item)
  elseif item.p == 'semaphore' then reason, ttl = extend_semaphore(keys, item)
  else return redis.error_reply('extend: not a renewed primitive: ' .. tostring(item.p)) end
  if reason then
    table.insert(lost, {index = i - 1, reason = reason})
  else
    table.insert(extended, i - 1)
    table.insert(granted, ttl)
  end
end

if #lost > 0 then return reply(LOST, {lost = lost, extended = extended, ttl_ms = granted}) end
return reply(OK, {extended = extended, ttl_ms = granted})
