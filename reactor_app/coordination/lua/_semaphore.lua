-- _semaphore.lua — fragment: the semaphore's waiter line — hand-off grants and fair turns —
-- shared by the general scripts (admit.lua, release.lua) and semaphore_leave.lua, so the line
-- has one set of rules whichever script carries it. Needs _common.lua before it.
--
-- Hand-off (as a lock's, _lock.lua): a release that frees a slot pops the head waiter and
-- grants it that slot for HANDOFF_GRANT_MS (WAITING_GRANT_MS for a waiter waiting in-process):
-- a member "grant:<waiter id>" scored -(grant expiry ms) in the waiters zset. While grants are
-- live, admission keeps that many free slots for their waiters, so a line is served in its
-- order (priority, fair turns) instead of by whoever asks first after the release.
--
-- Fair turns (`fair_by`, docs/coordination.md "Priority and fair sharing"): a fair line is
-- ordered by turn, not time. The fair hash (a fair claim's fourth key) maps each group to the next
-- turn it would get; a new waiter of group g gets turn max(head turn, next[g]) and moves
-- next[g] one past it, so the line is round-robin across groups and FIFO inside one. Its score
-- is FAIR_BASE + turn - priority (a priority level is worth one turn). The head turn is read
-- from the line's head; an empty line starts over (the hash is dropped). Turns and arrival
-- times do not mix: a key declared fair in one place and not in another serves the fair
-- waiters first (docs/coordination.md).

local FAIR_BASE = 1000000000
-- fair scores stay below this (FAIR_BASE plus the turns handed out, less at most 100 of
-- priority); plain waiters' scores are epoch milliseconds, far above it
local FAIR_LIMIT = 2 * FAIR_BASE
local SEMAPHORE_FREED_MESSAGE = '{"freed":true,"primitive":"semaphore"}'

-- The live grants of `waiters` (lapsed ones are dropped): `mine` is the member granted to
-- `waiter` (either form) if any; `others` how many other waiters hold a grant; `soonest` the
-- other grant that lapses first, {to = waiter id, left_ms}.
local function semaphore_grants(waiters, waiter, now_ms)
  local grants = redis.call('ZRANGEBYSCORE', waiters, '-inf', '(0', 'WITHSCORES')
  local mine, others, soonest = nil, 0, nil
  for i = 1, #grants, 2 do
    local name, until_ms = grants[i], -tonumber(grants[i + 1])
    if until_ms <= now_ms then
      redis.call('ZREM', waiters, name)
    elseif waiter ~= '' and (name == GRANT_PREFIX .. waiter
        or name == GRANT_PREFIX .. other_form(waiter)) then
      mine = name
    else
      others = others + 1
      if not soonest or until_ms - now_ms < soonest.left_ms then
        soonest = {to = string.sub(name, #GRANT_PREFIX + 1), left_ms = until_ms - now_ms}
      end
    end
  end
  return mine, others, soonest
end

-- Grant `to` (a waiter of the line `waiters`) a free slot: its entry becomes the grant
-- "grant:<to>" scored -(grant expiry ms), and a PUBLISH on the leases key names it
-- {primitive, freed, to, grant_ms}, waking it if it waits in-process.
local function semaphore_grant(leases, waiters, to, now_ms)
  local grant_ms = HANDOFF_GRANT_MS
  if string.sub(to, 1, #WAITING_PREFIX) == WAITING_PREFIX then
    grant_ms = WAITING_GRANT_MS
  end
  redis.call('ZREM', waiters, to)
  redis.call('ZADD', waiters, -(now_ms + grant_ms), GRANT_PREFIX .. to)
  redis.call('PUBLISH', leases, cjson.encode(
    {primitive = 'semaphore', freed = true, to = to, grant_ms = grant_ms}))
end

-- A freed slot goes to the head waiter (lowest score): grant it (semaphore_grant); without a
-- waiter, a plain "freed" message. Returns the waiter granted, or nil.
local function semaphore_hand_on(leases, waiters, now_ms)
  redis.call('ZREMRANGEBYSCORE', waiters, -now_ms, '(0') -- lapsed grants
  local head = redis.call('ZRANGEBYSCORE', waiters, 0, '+inf', 'LIMIT', 0, 1)
  if head[1] then
    semaphore_grant(leases, waiters, head[1], now_ms)
    return head[1]
  end
  redis.call('PUBLISH', leases, SEMAPHORE_FREED_MESSAGE)
  return nil
end

-- Free slots that no release handed on — a limit an operator raised live (no release
-- announces it), a crashed holder's lease that lapsed, a grant left unused — go to the line
-- first, in its order (priority, fair turns), as releases would have handed them: the first
-- `free` waiters are each granted one (semaphore_grant), and whoever asked is admitted only
-- if it is one of them or if slots are left once the line is served. Without this, the
-- first to ask after a raise took the slot: a newcomer, or whichever waiter's retry came
-- first, not the head of the line.
-- `waiter` (the caller, either form) among those first ones is not granted (it takes its slot
-- in this admission, and keeps its place if a later claim refuses it); the others granted are
-- appended to `granted` (parked ones must be re-enqueued by the caller). Returns whether the
-- caller's turn came, and the slots left over after the line.
local function semaphore_fill(leases, waiters, free, waiter, now_ms, granted)
  local heads = redis.call('ZRANGEBYSCORE', waiters, 0, '+inf', 'LIMIT', 0, free)
  local my_turn = false
  for _, head in ipairs(heads) do
    if waiter ~= '' and (head == waiter or head == other_form(waiter)) then
      my_turn = true
    else
      semaphore_grant(leases, waiters, head, now_ms)
      granted[#granted + 1] = head
    end
  end
  return my_turn, free - #heads
end

-- The score of a new waiter of `group` in the fair line `waiters` (see above); called only for
-- a waiter not in the line yet (waiter_register), so each waiter takes one turn.
local function fair_score(waiters, fair, group, priority)
  -- the head is a fair waiter only if the line holds any (a turn scores below every arrival
  -- time, FAIR_LIMIT): a plain waiter's arrival time is no turn, and the fair waiters go first
  local head = redis.call('ZRANGEBYSCORE', waiters, 0, '(' .. FAIR_LIMIT, 'WITHSCORES',
    'LIMIT', 0, 1)
  local turn = 0
  if head[1] then
    turn = math.max(tonumber(head[2]) - FAIR_BASE, 0)
    turn = math.max(turn, tonumber(redis.call('HGET', fair, group) or '0'))
  else
    redis.call('DEL', fair) -- a line without fair waiters starts over
  end
  redis.call('HSET', fair, group, turn + 1)
  redis.call('PEXPIRE', fair, 86400000)
  return FAIR_BASE + turn - (tonumber(priority) or 0)
end
