--[[ lock_leave.lua — a waiter stops waiting for a lock.

A waiter registered in a lock's waiter order (a synchronous caller whose wait ran out, a worker
delivery that stops waiting in-process) leaves it. If the last release had already handed the
free key to it (its grant, unused), the key goes on to the next waiter at once, as a release
would hand it on — instead of staying reserved for a waiter that is gone until the grant
lapses (HANDOFF_GRANT_MS).

KEYS  hold hash, waiters zset
ARGV  waiter id

Returns the waiter the key was handed on to, or "" (none: it was not granted to the leaving
waiter, the key is held again, or nobody else waits).
]]

-- @include _common.lua
-- @include _lock.lua

local hold, waiters, waiter = KEYS[1], KEYS[2], ARGV[1]
redis.call('ZREM', waiters, waiter)
if redis.call('ZREM', waiters, GRANT_PREFIX .. waiter) == 1 and redis.call('EXISTS', hold) == 0 then
  return lock_hand_on(hold, waiters, function() return redis_now().ms end) or ''
end
return ''
