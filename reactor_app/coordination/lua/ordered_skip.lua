--[[ ordered_skip.lua — operator action: pass over the head of an ordered lock's line.

The head position is completed without running (its holder, if alive, will find its position
passed and must re-assign). The next live position is woken.

KEYS[1]  state hash   KEYS[2]  positions zset   KEYS[3]  holders hash   KEYS[4]  waiters zset
ARGV[1]  ttl_ms — lifetime of the ordered-lock state after this activity

Returns {status, json}:
  0 OK         {skipped = nonce, cursor = new last completed, woken = [waiter ids]}
  9 NOT_FOUND  {} — no position is waiting
]]

-- @include _common.lua
-- @include _ordered.lua

local k = ordered_keys(KEYS)
local cursor = ordered_cursor(k)
local last_assigned = tonumber(redis.call('HGET', k.state, 'next') or '0')
if cursor >= last_assigned then return reply(NOT_FOUND, {}) end
local head = cursor + 1
local new_cursor, woken = ordered_complete(k, head)
ordered_touch(k, tonumber(ARGV[1]))
return reply(OK, {skipped = head, cursor = new_cursor, woken = woken})
