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

local epoch = tonumber(redis.call('HGET', k.state, 'epoch') or '0')
if epoch == 0 then
  epoch = now.ms
  redis.call('HSET', k.state, 'epoch', epoch, 'next', 0, 'cursor', 0)
end
local nonce = redis.call('HINCRBY', k.state, 'next', 1)
holder.assigned_at = now.ms
redis.call('ZADD', k.positions, now.ms, nonce)
redis.call('HSET', k.holders, nonce, cjson.encode(holder))
ordered_touch(k, ttl_ms)
return reply(OK, {nonce = nonce, epoch = epoch, last_completed = ordered_cursor(k)})
