--[[ release.lua — release N holds in one step, in reverse admission order, with an outcome.

Outcomes:
  success    period buckets are marked done with the execution; ordered cursors advance
  failure    ordered cursors advance; a strict ordered lock records first_failed
  rollback   (holds re-taken for compensate/undo) treated like failure; never marks
  halt       a clean stop or a skip: ordered cursors advance, nothing is marked, and the
             strict chain is not stopped (nothing failed)
  retry/park the ordered position is kept (heartbeat refreshed), nothing is marked
  give_back  undo an admission that must not count (per-claim admission on a cluster):
             like retry, and the rate-limit charge is refunded
Locks, semaphores and period reservations are re-entrant: one release removes one nesting
level, and the key (or the slot, or the bucket) is freed at zero. Whenever something is actually
freed a wake message is PUBLISHed on the freed base key's name (used as the channel; for a
period, the reservations hash) and one parked waiter is popped for it — every waiter of a
period bucket marked done (they all skip now).

A period reservation ends with any outcome at nesting zero: done on "success" (the mark), free
otherwise, so a failed, halted, parked or retried holder never uses the bucket up.

A freed lock is granted to the waiter popped for it for HANDOFF_GRANT_MS (a "grant:<id>"
member with score -expiry in the waiters zset): admit.lua refuses everyone else meanwhile, so
waiters are served in the order they registered. Its wake message names that waiter
({primitive, freed, to = waiter id, grant_ms}); other wake messages name nobody.

KEYS — one group per hold, in the order of ARGV[3]; a group's size is its spec's `n`:
  lock       (2+I): hold hash, waiters zset
  semaphore  (3+I): leases zset, holders hash, waiters zset
  I = 0, or 4 with the live-holds index (_common.lua): by-time, by-key, by-expiry zsets, counts
  ordered_lock (4): state hash, positions zset, holders hash, waiters zset
  period       (3): done mark hash, reservations hash, waiters zset
  rate_limit (W+T): one zset (sliding) or counter (fixed) per window; then (sliding: T = W)
                    each window's running-total hash {cost, n} (see admit.lua)

ARGV[1]  outcome (see above)
ARGV[2]  holder json: {owner, execution?}
ARGV[3]  holds json, in release order; each {p = primitive, n = key count} plus:
           ordered_lock: nonce, epoch (ms), strict (bool), ttl_ms
           period:       every, bucket? (start epoch s), bucket_end? (epoch s) — as admitted;
                         without them the bucket of the current Redis time is used
           rate_limit:   strategy, member? (the sliding-window entry added at admission),
                         cost? (units charged, default 1), w? (window count, default all keys)
           lock, semaphore: ik? (user key, when the index keys follow)

Returns {0, json {freed = [base keys], woken = [waiter ids], not_held = [base keys],
                  marked = [mark keys], advanced = [{key, cursor}]}}
]]

-- @include _common.lua
-- @include _lock.lua
-- @include _calendar.lua
-- @include _ordered.lua

local now = redis_now()
local outcome = ARGV[1]
local holder = cjson.decode(ARGV[2])
local holds = cjson.decode(ARGV[3])
local terminal = outcome == 'success' or outcome == 'failure' or outcome == 'rollback'
  or outcome == 'halt'

local report = {freed = {}, woken = {}, not_held = {}, marked = {}, advanced = {}}

local function wake_one(base, waiters, message)
  redis.call('PUBLISH', base, cjson.encode(message))
  local popped = redis.call('ZPOPMIN', waiters, 1)
  if popped[1] then table.insert(report.woken, popped[1]) end
  table.insert(report.freed, base)
end

local function release_lock(keys, spec)
  local state, popped = lock_release(keys[1], keys[2], holder.owner, function() return now.ms end,
    index_of(keys, 3, spec.ik))
  if state == 'not_held' then table.insert(report.not_held, keys[1])
  elseif state == 'freed' then
    if popped then table.insert(report.woken, popped) end
    table.insert(report.freed, keys[1])
  end
end

local function release_semaphore(keys, spec)
  local leases, holders, waiters = keys[1], keys[2], keys[3]
  local index = index_of(keys, 4, spec.ik)
  if not redis.call('ZSCORE', leases, holder.owner) then
    table.insert(report.not_held, leases)
    index_remove(index, 'semaphore', holder.owner)
    return
  end
  local info = cjson.decode(redis.call('HGET', holders, holder.owner) or '{"count":1}')
  info.count = (info.count or 1) - 1
  if info.count > 0 then
    redis.call('HSET', holders, holder.owner, cjson.encode(info))
    return
  end
  redis.call('ZREM', leases, holder.owner)
  redis.call('HDEL', holders, holder.owner)
  index_remove(index, 'semaphore', holder.owner)
  wake_one(leases, waiters, {primitive = 'semaphore', freed = true})
end

local function release_ordered(keys, spec)
  local k = ordered_keys(keys)
  local epoch = tonumber(redis.call('HGET', k.state, 'epoch') or '0')
  if epoch ~= spec.epoch then
    table.insert(report.not_held, k.state) -- reset while we held it: nothing of ours remains
    return
  end
  if not terminal then
    if tonumber(redis.call('HGET', k.state, 'in_flight') or '0') == spec.nonce then
      redis.call('HDEL', k.state, 'in_flight')
    end
    redis.call('ZADD', k.positions, 'XX', now.ms, spec.nonce)
    ordered_touch(k, spec.ttl_ms)
    return
  end
  if spec.strict and (outcome == 'failure' or outcome == 'rollback') then
    local first_failed = tonumber(redis.call('HGET', k.state, 'first_failed') or '0')
    if first_failed == 0 or spec.nonce < first_failed then
      redis.call('HSET', k.state, 'first_failed', spec.nonce)
    end
  end
  local cursor, woken = ordered_complete(k, spec.nonce)
  for _, id in ipairs(woken) do table.insert(report.woken, id) end
  if cursor then
    table.insert(report.advanced, {key = k.state, cursor = cursor})
    table.insert(report.freed, k.state)
  end
  ordered_touch(k, spec.ttl_ms)
end

local function release_period(keys, spec)
  local mark, reserved, waiters = keys[1], keys[2], keys[3]
  local start, finish = spec.bucket, spec.bucket_end
  if not start then start, finish = period_bucket(spec.every, now.seconds) end
  local raw = redis.call('HGET', reserved, int(start))
  local entry = raw and cjson.decode(raw) or nil
  local ours = entry ~= nil and entry.owner == holder.owner
  if ours and (entry.count or 1) > 1 then
    -- a nested hold: the outermost release decides done or free
    entry.count = entry.count - 1
    redis.call('HSET', reserved, int(start), cjson.encode(entry))
    return
  end
  if ours then
    redis.call('HDEL', reserved, int(start))
  else
    -- lapsed and possibly reserved by another since (its lease was lost)
    table.insert(report.not_held, mark)
  end
  local done = false
  -- a bucket that is over needs no mark, and a newer bucket's mark must never be replaced
  if outcome == 'success' and now.seconds < finish then
    local current = tonumber(redis.call('HGET', mark, 'bucket') or '-1')
    if current <= start then
      redis.call('HSET', mark, 'bucket', start, 'by', holder.execution or holder.owner,
        'at', now.ms)
      redis.call('PEXPIREAT', mark, int(finish * 1000))
      table.insert(report.marked, mark)
      done = true
    end
  end
  if not ours then return end
  redis.call('PUBLISH', reserved, cjson.encode({primitive = 'period', freed = true, done = done}))
  if done then
    -- every waiter of this bucket skips now
    for _, id in ipairs(redis.call('ZRANGE', waiters, 0, -1)) do
      table.insert(report.woken, id)
    end
    redis.call('DEL', waiters)
  else
    local popped = redis.call('ZPOPMIN', waiters, 1)
    if popped[1] then table.insert(report.woken, popped[1]) end
  end
  table.insert(report.freed, mark)
end

local function release_rate_limit(keys, spec)
  if outcome ~= 'give_back' then return end -- a charge is spent once the work was admitted
  local cost = spec.cost or 1
  local windows = spec.w or #keys
  for i = 1, windows do
    local name = keys[i]
    if spec.strategy == 'fixed' then
      local count = tonumber(redis.call('GET', name) or '0')
      if count > 0 then redis.call('DECRBY', name, math.min(cost, count)) end
    elseif spec.member then
      local total_key = keys[windows + i]
      -- the running total follows its member out (a missing total is rebuilt on next check)
      if redis.call('ZREM', name, spec.member) == 1 and total_key
          and redis.call('EXISTS', total_key) == 1 then
        redis.call('HINCRBY', total_key, 'cost', -cost)
        redis.call('HINCRBY', total_key, 'n', -1)
      end
    end
  end
end

split_keys(holds)
for _, spec in ipairs(holds) do
  local keys = spec.keys
  if spec.p == 'lock' then release_lock(keys, spec)
  elseif spec.p == 'semaphore' then release_semaphore(keys, spec)
  elseif spec.p == 'ordered_lock' then release_ordered(keys, spec)
  elseif spec.p == 'period' then release_period(keys, spec)
  elseif spec.p == 'rate_limit' then release_rate_limit(keys, spec)
  end
end

return reply(OK, report)
