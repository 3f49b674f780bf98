--[[ ordered_reset.lua — operator action: start a new epoch of an ordered lock.

Clears the line, the cursor and a strict lock's recorded failure. Every position assigned
before is stale from now on: its holder is refused (ORDERED_STALE) and must re-assign. All
parked waiters are returned so that they learn it promptly.

KEYS[1]  state hash   KEYS[2]  positions zset   KEYS[3]  holders hash   KEYS[4]  waiters zset
ARGV[1]  ttl_ms — lifetime of the ordered-lock state after this activity

Returns {0, json {epoch (ms), previous_epoch, woken = [waiter ids]}}
]]

-- @include _common.lua
-- @include _ordered.lua

local now = redis_now()
local k = ordered_keys(KEYS)
local previous = tonumber(redis.call('HGET', k.state, 'epoch') or '0')
local epoch = math.max(now.ms, previous + 1)
local woken = redis.call('ZRANGE', k.waiters, 0, -1)
redis.call('DEL', k.state, k.positions, k.holders, k.waiters)
redis.call('HSET', k.state, 'epoch', epoch, 'next', 0, 'cursor', 0)
ordered_touch(k, tonumber(ARGV[1]))
redis.call('PUBLISH', k.state, cjson.encode({primitive = 'ordered_lock', reset = epoch}))
return reply(OK, {epoch = epoch, previous_epoch = previous, woken = woken})
