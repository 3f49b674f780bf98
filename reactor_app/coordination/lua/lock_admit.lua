--[[ lock_admit.lua — admit one lock claim: the single-lock fast path of admit.lua.

The same rules as a lock claim in admit.lua (shared through _lock.lua: re-entry, FIFO hand-off
grants, fencing tokens, the live-holds index), without the general script's JSON: the arguments
and the answer are flat, so the most common admission — one step with one lock — costs the
server a handful of commands and the client no JSON (docs/architecture.md, step 7).

KEYS  hold hash, fence, waiters zset; then, optionally, the four live-holds index keys
      (by-time zset, by-key zset, by-expiry zset, counts hash; see _common.lua)
ARGV  owner, step, execution, reactor (each "" when absent), ttl ms, waiter id or "",
      user key for the index (only read when the index keys are passed), priority (the
      waiter's, default 0: see waiter_score in _common.lua); then, always last, the call's
      request id and "1" (a send that may repeat an earlier one: look for it) or "0" (its
      first send)

Retry safety without a stored-reply key (coordination/stored_replies.py, KEEPS_ITS_REQUEST):
an admission writes "<request id>@<time>@<fresh>" into the hold's `request` field, and a
resend that finds its own id there, on a hold of its owner, is answered from it — same time,
same token, not entered again. Anything else is answered anew: a lost refusal took nothing
but the waiter's place, which waiter_register keeps; a hold that lapsed or was taken from the
owner since is not this call's any more.

Returns a flat list:
  {0, time "s.us", fresh 1|0, token text}                      admitted
  {1, time "s.us", retry_after_ms (-1: none), blocker owner, step, execution, reactor,
   since ms (-1), ttl ms (-1), granted_to}                       LOCKED ("" for an absent text)
On a refusal with a waiter id, the waiter is registered (a waiter keeps its place, in either
of its forms: waiter_register in _common.lua); on admission it is removed, in both forms.
]]

-- @include _common.lua
-- @include _lock.lua

local hold, fence, waiters = KEYS[1], KEYS[2], KEYS[3]
local given = #ARGV - 2 -- the operation's own arguments; the request id and the look flag end ARGV
local request = ARGV[given + 1]
local h = {owner = ARGV[1], step = ARGV[2], execution = ARGV[3], reactor = ARGV[4]}
local ttl_ms, waiter = tonumber(ARGV[5]), ARGV[6]
local user_key = given >= 7 and ARGV[7] or nil
local priority = given >= 8 and ARGV[8] or nil

if ARGV[given + 2] ~= '0' then
  -- a resend: answered from the hold when the lost send was admitted
  local held = redis.call('HMGET', hold, 'owner', 'request', 'token')
  if held[1] == h.owner and held[2] then
    local id, at, fresh = string.match(held[2], '^(.*)@([^@]*)@([01])$')
    if id == request then return {OK, at, tonumber(fresh), held[3]} end
  end
end

local now = redis_now()
local state, refused = lock_check(hold, waiters, h.owner, waiter, now.ms)
if refused then
  if waiter ~= '' then waiter_register(waiters, waiter, waiter_score(now, priority)) end
  local b = refused.blocker
  return {LOCKED, now.text, refused.retry_after_ms or -1, b.owner or '', b.step or '',
          b.execution or '', b.reactor or '', b.since or -1, b.ttl_ms or -1, b.granted_to or ''}
end
local fresh = state ~= 'again' and 1 or 0
h.request = request .. '@' .. now.text .. '@' .. fresh
local token = lock_take(hold, fence, waiters, h, ttl_ms, now, state, index_of(KEYS, 4, user_key))
if waiter ~= '' then waiter_remove(waiters, waiter) end
return {OK, now.text, fresh, token}
