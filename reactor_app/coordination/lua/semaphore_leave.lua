--[[ semaphore_leave.lua — a waiter stops waiting for a semaphore slot.

A waiter registered in a semaphore's line (a synchronous caller whose wait ran out, a worker
delivery that stops waiting in-process) leaves it. If the last release had already handed a
free slot to it (its grant, unused), the slot goes on to the next waiter at once, as a release
would hand it on — instead of staying reserved for a waiter that is gone until the grant
lapses (HANDOFF_GRANT_MS). The lock's counterpart is lock_leave.lua.

KEYS  leases zset, waiters zset
ARGV  waiter id

Returns the waiter the slot was handed on to, or "" (none: no slot was granted to the leaving
waiter, or nobody else waits).
]]

-- @include _common.lua
-- @include _semaphore.lua

local leases, waiters, waiter = KEYS[1], KEYS[2], ARGV[1]
redis.call('ZREM', waiters, waiter)
if redis.call('ZREM', waiters, GRANT_PREFIX .. waiter) == 1 then
  return semaphore_hand_on(leases, waiters, redis_now().ms) or ''
end
return ''
