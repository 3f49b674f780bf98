--[[ lock_admit.lua — admit one lock claim: the single-lock fast path of admit.lua.

The same rules as a lock claim in admit.lua (shared through _lock.lua: re-entry, FIFO hand-off
grants, fencing tokens, the live-holds index), without the general script's JSON: the arguments
and the answer are flat, so the most common admission — one step with one lock — costs the
server a handful of commands and the client no JSON (docs/architecture.md, step 7).

KEYS  hold hash, fence, waiters zset; then, optionally, the four live-holds index keys
      (by-time zset, by-key zset, by-expiry zset, counts hash; see _common.lua)
ARGV  owner, step, execution, reactor (each "" when absent), ttl ms, waiter id or "",
      user key for the index (only read when the index keys are passed), priority (the
      waiter's, default 0: see waiter_score in _common.lua)

Returns a flat list:
  {0, time "s.us", fresh 1|0, token text}                      admitted
  {1, time "s.us", retry_after_ms (-1: none), blocker owner, step, execution, reactor,
   since ms (-1), ttl ms (-1), granted_to}                       LOCKED ("" for an absent text)
On a refusal with a waiter id, the waiter is registered (a waiter keeps its place, in either
of its forms: waiter_register in _common.lua); on admission it is removed, in both forms.
]]

-- @include _common.lua
-- @include _lock.lua

local now = redis_now()
local hold, fence, waiters = KEYS[1], KEYS[2], KEYS[3]
local h = {owner = ARGV[1], step = ARGV[2], execution = ARGV[3], reactor = ARGV[4]}
local ttl_ms, waiter = tonumber(ARGV[5]), ARGV[6]

local state, refused = lock_check(hold, waiters, h.owner, waiter, now.ms)
if refused then
  if waiter ~= '' then waiter_register(waiters, waiter, waiter_score(now, ARGV[8])) end
  local b = refused.blocker
  return {LOCKED, now.text, refused.retry_after_ms or -1, b.owner or '', b.step or '',
          b.execution or '', b.reactor or '', b.since or -1, b.ttl_ms or -1, b.granted_to or ''}
end
local token = lock_take(hold, fence, waiters, h, ttl_ms, now, state, index_of(KEYS, 4, ARGV[7]))
if waiter ~= '' then waiter_remove(waiters, waiter) end
return {OK, now.text, state ~= 'again' and 1 or 0, token}
