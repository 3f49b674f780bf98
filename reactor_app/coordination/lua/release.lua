--[[ release.lua — release N holds in one step, in reverse admission order, with an outcome.

Each primitive's release is the `release` section of its own file, lua/primitives/<name>.lua,
spliced in at the `-- @primitives release` line below (coordination/scripts.py).

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
period bucket marked done (they all skip now). A freed lock or semaphore slot is granted to the
waiter popped for it (below; the semaphore's line: _semaphore.lua).

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
           semaphore:    lease? (the acquisition, as admitted: the owner's slot under another
                         lease is a later acquisition and is reported not held), limit? (a
                         named limit as it is now: while the live slots left are not under
                         it, the freed slot is granted to no waiter)
ARGV[4]  F (optional, default 0): how many flag keys end KEYS, after every group — when one of
         them is set nothing is released and the reply is {0, json {flagged = its value}}

Returns {0, json {freed = [base keys], woken = [waiter ids], not_held = [base keys],
                  marked = [mark keys], advanced = [{key, cursor}]}}
]]

-- @include _common.lua
-- @include _lock.lua
-- @include _semaphore.lua
-- @include _calendar.lua
-- @include _ordered.lua

-- The call's own values: declared here, before the functions that read them, and set for each
-- call after the `-- @per_call` line. The Functions library runs everything above that line
-- once, when it loads (lua/_library.lua); an EVALSHA script runs all of it on every call.
local now, outcome, holder, holds, terminal, report

-- each primitive's release (lua/primitives/<name>.lua), by primitive name
local RELEASE = {}

-- @primitives release

-- @per_call
local flags = tonumber(ARGV[4] or '0')
if flags > 0 then
  local raised = raised_flag(flags)
  if raised then return reply(OK, {flagged = raised}) end
end

now = redis_now()
outcome = ARGV[1]
holder = cjson.decode(ARGV[2])
holds = cjson.decode(ARGV[3])
terminal = outcome == 'success' or outcome == 'failure' or outcome == 'rollback'
  or outcome == 'halt'
report = {freed = {}, woken = {}, not_held = {}, marked = {}, advanced = {}}

split_keys(holds)
for _, spec in ipairs(holds) do
  local keys = spec.keys
  local release = RELEASE[spec.p]
  if release then release(keys, spec) end
end

return reply(OK, report)
