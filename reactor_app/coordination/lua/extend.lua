--[[ extend.lua — renew leases still owned by their holder (the auto-extend thread, §2.6).

Each primitive's renewal is the `extend` section of its own file, lua/primitives/<name>.lua,
spliced in at the `-- @primitives extend` line below (coordination/scripts.py).

A lock is renewed only while its hash still names this owner AND this fencing token: a lock
that lapsed and was taken again, even by the same owner, is reported lost. A semaphore lease is
renewed only while it exists, names this owner, has not expired and — when the item names its
lease — is still that acquisition (reason "token" otherwise). A period reservation is renewed
only while it exists, names this owner and has not expired.
A renewed lease never gets shorter.

KEYS — one group per item, in the order of ARGV[1]:
  lock      (1+I): hold hash
  semaphore (2+I): leases zset (owner -> lease expiry ms), holders hash
  period    (1): reservations hash (bucket start s -> json {owner, count, ..., expires ms})
  I = 0, or 4 with the live-holds index (_common.lua): a renewed lease moves the hold's entry
  in the by-expiry zset
ARGV[1]  items json: [{p = "lock" | "semaphore" | "period", n = key count, owner,
                       ik? (locks, semaphores: the user key, when the index keys follow),
                       token? (locks), lease? (semaphores: the acquisition, as admitted),
                       bucket? (periods: the reserved bucket's start, epoch s),
                       ttl_ms (the lease to grant from now; 0 = only check that the hold is
                       still ours, leaving its lease as it is)}]

Returns {status, json}:
  0 OK    {extended = [item indexes, 0-based], ttl_ms = [lease left per extended item]}
  8 LOST  {lost = [{index, reason = "released" | "owner" | "token" | "expired"}],
           extended = [...]} — the other items were still renewed
]]

-- @include _common.lua

-- The call's own values: declared here, before the functions that read them, and set for each
-- call after the `-- @per_call` line. The Functions library runs everything above that line
-- once, when it loads (lua/_library.lua); an EVALSHA script runs all of it on every call.
local now

-- the renewal of each renewed primitive (lua/primitives/<name>.lua), by primitive name
local EXTEND = {}

-- @primitives extend

-- @per_call
now = redis_now()
local items = cjson.decode(ARGV[1])
local extended, granted, lost = {}, {}, {}
split_keys(items)
for i, item in ipairs(items) do
  local keys = item.keys
  local reason, ttl
  local extend = EXTEND[item.p]
  if not extend then
    return redis.error_reply('extend: not a renewed primitive: ' .. tostring(item.p))
  end
  reason, ttl = extend(keys, item)
  if reason then
    table.insert(lost, {index = i - 1, reason = reason})
  else
    table.insert(extended, i - 1)
    table.insert(granted, ttl)
  end
end

if #lost > 0 then return reply(LOST, {lost = lost, extended = extended, ttl_ms = granted}) end
return reply(OK, {extended = extended, ttl_ms = granted})
