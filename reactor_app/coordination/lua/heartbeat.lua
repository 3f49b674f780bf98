--[[ heartbeat.lua — an ordered-lock position says it is alive (§2.6 "Ordered lock").

A position whose heartbeat is older than the poison-pill timeout may be passed over by the
positions behind it; the running head and any waiting position call this to stay in line.

KEYS[1]  state hash (epoch, next, cursor, first_failed, in_flight)
KEYS[2]  positions zset (nonce -> last heartbeat ms)
KEYS[3]  holders hash (nonce -> holder json)
KEYS[4]  waiters zset (waiter id -> nonce)
ARGV[1]  nonce
ARGV[2]  epoch (ms, as assigned)
ARGV[3]  ttl_ms — lifetime of the ordered-lock state after this activity; 0 keeps the
         lifetime it has (the sweep vouching for a queued or parked execution, which does not
         know the declaration's ttl)

Returns {status, json}:
  0 OK    {nonce, last_completed}
  8 LOST  {nonce, reason = "epoch" (reset since) | "passed" (completed, skipped or passed over)}
]]

-- @include _common.lua
-- @include _ordered.lua

local now = redis_now()
local k = ordered_keys(KEYS)
local nonce, epoch, ttl_ms = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])

if tonumber(redis.call('HGET', k.state, 'epoch') or '0') ~= epoch then
  return reply(LOST, {nonce = nonce, reason = 'epoch'})
end
if not redis.call('ZSCORE', k.positions, nonce) then
  return reply(LOST, {nonce = nonce, reason = 'passed'})
end
redis.call('ZADD', k.positions, 'XX', now.ms, nonce)
if ttl_ms > 0 then ordered_refresh(k, ttl_ms, false) end
return reply(OK, {nonce = nonce, last_completed = ordered_cursor(k)})
