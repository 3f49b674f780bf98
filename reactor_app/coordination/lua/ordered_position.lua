--[[ ordered_position.lua — assign the next position (nonce) in an ordered lock's line.

The first assignment (or the first after the state expired) starts a new epoch: the Redis
time in ms, kept strictly above any earlier epoch of the key, so positions from before a reset
or an expiry are always recognisably stale.

KEYS[1]  state hash (epoch, next = last nonce assigned, cursor = last completed, first_failed,
         in_flight)
KEYS[2]  positions zset (nonce -> last heartbeat ms)
KEYS[3]  holders hash (nonce -> holder json)
KEYS[4]  waiters zset (waiter id -> nonce)
ARGV[1]  holder json {owner, execution?, step?, reactor?}
ARGV[2]  ttl_ms — lifetime of the ordered-lock state after this activity

Returns {0, json {nonce, epoch (ms), last_completed}}
]]

-- @include _common.lua
-- @include _ordered.lua

local now = redis_now()
local k = ordered_keys(KEYS)
local holder = cjson.decode(ARGV[1])
local ttl_ms = tonumber(ARGV[2])

local nonce, epoch = ordered_assign(k, holder, ttl_ms, now)
return reply(OK, {nonce = nonce, epoch = epoch, last_completed = ordered_cursor(k)})
