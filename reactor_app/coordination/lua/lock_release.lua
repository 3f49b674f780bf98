--[[ lock_release.lua — release one lock hold: the single-lock fast path of release.lua.

The same rules as a lock in release.lua (shared through _lock.lua): one nesting level per
release; at zero the key is freed, a wake message is PUBLISHed on the hold key and the head
waiter is popped and granted the key for HANDOFF_GRANT_MS. A lock's release does not depend on
the outcome, so none is passed.

KEYS  hold hash, waiters zset; then, optionally, the four live-holds index keys; then F flag
      keys (see ARGV[3])
ARGV  owner, user key for the index (only read when the index keys are passed), F (optional,
      default 0): how many flag keys end KEYS — when one of them is set, nothing is released,
      token (optional, "" to skip): the admission's fencing token — a hold of the same owner
      under another token is a later acquisition, not this one's (state 2)

Returns {state, woken}: state 0 freed, 1 kept (still nested), 2 not held (lapsed, taken over,
or re-taken under a newer token); woken = the waiter id popped for the freed key, or "".
State 3: a flag is set, nothing was released, and the second element is the flag's value.
]]

-- @include _common.lua
-- @include _lock.lua

local flags = tonumber(ARGV[3] or '0')
if flags > 0 then
  local raised = raised_flag(flags)
  if raised then return {3, raised} end
end
local index = nil
if #KEYS - flags >= 6 then index = index_of(KEYS, 3, ARGV[2]) end
local state, popped = lock_release(KEYS[1], KEYS[2], ARGV[1], redis_now_ms, index, ARGV[4])
return {RELEASE_CODES[state], popped or ''}
