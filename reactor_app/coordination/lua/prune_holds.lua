--[[ prune_holds.lua — drop live-holds index entries whose hold is gone (operator listings).

A reader that found an index entry whose hold lapsed (a lock key that expired, a semaphore
lease past its expiry) asks for it to be removed; the liveness is checked again here,
atomically, so an entry re-added by a new admission in between is never removed.

KEYS[1..4]  the index: by-time, by-key, by-expiry zsets, counts hash (see _common.lua) — on a
            cluster, the shard of the candidates' hash slot
KEYS[5..]   one per candidate, in the order of ARGV[1]: the lock's hold hash, or the
            semaphore's leases zset
ARGV[1]     candidates json: [{p = "lock" | "semaphore", key = user key, owner}]

Returns {0, json {pruned = [candidate indexes, 0-based]}}
]]

-- @include _common.lua

local now = redis_now()
local candidates = cjson.decode(ARGV[1])
local pruned = {}

for i, candidate in ipairs(candidates) do
  local name = KEYS[4 + i]
  local alive
  if candidate.p == 'lock' then
    alive = redis.call('HGET', name, 'owner') == candidate.owner
  else
    local expiry = redis.call('ZSCORE', name, candidate.owner)
    alive = expiry ~= false and tonumber(expiry) > now.ms
  end
  if not alive then
    index_remove(index_of(KEYS, 1, candidate.key), candidate.p, candidate.owner)
    table.insert(pruned, i - 1)
  end
end

return reply(OK, {pruned = pruned})
