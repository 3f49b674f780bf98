--[[ debounce.lua — one start of a debounced burst (reactor_app.coordination.debounce).

A burst is the starts with one key that come before the latest of them is due. Each start
becomes the latest and pushes the run back to a quiet period after itself, but never past the
burst's first start plus the max wait. A start after the latest came due opens a new burst:
that one is running or ran, nothing supersedes it.

KEYS[1]  the burst's hash: latest (execution id), first and due (epoch ms, Redis time)
KEYS[2]  the burst's starts so far (a list of execution ids, oldest first)
ARGV[1]  this start's execution id
ARGV[2]  quiet period (ms)
ARGV[3]  max wait (ms), or "" for none

Returns {status, json}:
  0 OK  {earlier = the burst's starts before this one (this one replaces them),
         due_in = ms until this one runs}
]]

-- @include _common.lua

local id, quiet, max_wait = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3] or '')
local now = redis_now().ms
local burst = redis.call('HMGET', KEYS[1], 'latest', 'first', 'due')
local latest, first, due = burst[1], tonumber(burst[2] or ''), tonumber(burst[3] or '')
local earlier = {}
if latest and first and due and now < due then
  earlier = redis.call('LRANGE', KEYS[2], 0, -1)
else
  first = now
  redis.call('DEL', KEYS[2])
end
local runs_at = now + quiet
if max_wait and first + max_wait < runs_at then runs_at = math.max(first + max_wait, now) end
redis.call('HSET', KEYS[1], 'latest', id, 'first', int(first), 'due', int(runs_at))
redis.call('RPUSH', KEYS[2], id)
-- kept past the due time: a start that lands just after it still finds (and ignores) the burst
local keep = runs_at - now + quiet + 1000
redis.call('PEXPIRE', KEYS[1], keep)
redis.call('PEXPIRE', KEYS[2], keep)
return reply(OK, {earlier = earlier, due_in = runs_at - now})
