--[[ force_release.lua — operator action: free a lock or semaphore whatever its nesting.

The holder is not asked; its next renewal reports the lease lost. One parked waiter is popped
per freed slot and a wake message is PUBLISHed on the base key's name. A freed lock or slot is
handed on as a release hands it on (lock_hand_on in _lock.lua, semaphore_hand_on in
_semaphore.lua): its head waiter is granted it for a moment and the message names it, so the
waiters stay served in the order they came (unless ARGV[4] says otherwise); the grants other
waiters of a semaphore hold from earlier releases stay theirs.

KEYS (lock)       KEYS[1] hold hash, KEYS[2] waiters zset, [KEYS[3..6] index]
KEYS (semaphore)  KEYS[1] leases zset, KEYS[2] holders hash, KEYS[3] waiters zset,
                  [KEYS[4..7] index]
                  index: the live-holds index (_common.lua), by-time, by-key, by-expiry zsets,
                  counts hash
ARGV[1]  primitive: "lock" | "semaphore"
ARGV[2]  owner to release, or "" for any owner (every holder of a semaphore)
ARGV[3]  the user key, when the index keys are passed (else "" or absent)
ARGV[4]  "0": a freed lock or slot is not handed on (a lock's grant dropped; the head waiter
         popped and woken to try again) — for a delivery that takes over a dead one's holds
         and takes them again at once; else (default) it is handed on, as a release hands it
         on

Returns {status, json}:
  0 OK         {released = [owners], woken = [waiter ids]}
  9 NOT_FOUND  {} — nothing held (by that owner)
]]

-- @include _common.lua
-- @include _lock.lua
-- @include _semaphore.lua

local primitive, owner = ARGV[1], ARGV[2]
local hand_on = ARGV[4] ~= '0'
local user_key = (ARGV[3] or '') ~= '' and ARGV[3] or nil
local released, woken = {}, {}

local function pop_waiter(waiters)
  redis.call('ZREMRANGEBYSCORE', waiters, '-inf', '(0') -- a lock's hand-off grant
  local popped = redis.call('ZPOPMIN', waiters, 1)
  if popped[1] then table.insert(woken, popped[1]) end
end

if primitive == 'lock' then
  local current = redis.call('HGET', KEYS[1], 'owner')
  if not current or (owner ~= '' and current ~= owner) then return reply(NOT_FOUND, {}) end
  redis.call('DEL', KEYS[1])
  index_remove(index_of(KEYS, 3, user_key), 'lock', current)
  table.insert(released, current)
  if hand_on then
    local handed = lock_hand_on(KEYS[1], KEYS[2], function() return redis_now().ms end)
    if handed then table.insert(woken, handed) end
    return reply(OK, {released = released, woken = woken})
  end
  pop_waiter(KEYS[2])
elseif primitive == 'semaphore' then
  -- holders whose lease lives: a lapsed one (not purged yet: the next admission does that)
  -- holds nothing, so it is neither released, nor audited, nor worth a waiter's wake-up
  local now_ms = redis_now().ms
  local owners
  if owner ~= '' then
    local expiry = redis.call('ZSCORE', KEYS[1], owner)
    owners = (expiry and tonumber(expiry) > now_ms) and {owner} or {}
  else
    owners = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. int(now_ms), '+inf')
  end
  if #owners == 0 then return reply(NOT_FOUND, {}) end
  redis.call('ZREM', KEYS[1], unpack(owners))
  redis.call('HDEL', KEYS[2], unpack(owners))
  local index = index_of(KEYS, 4, user_key)
  for _, name in ipairs(owners) do
    index_remove(index, 'semaphore', name)
    table.insert(released, name)
    if hand_on then
      -- handed on as a release hands a slot on (_semaphore.lua); the grants other waiters
      -- hold from earlier releases stay theirs
      local handed = semaphore_hand_on(KEYS[1], KEYS[3], now_ms)
      if handed then table.insert(woken, handed) end
    else
      -- the head waiter (grants, scored below 0, are not waiters), woken to try again
      local head = redis.call('ZRANGEBYSCORE', KEYS[3], 0, '+inf', 'LIMIT', 0, 1)
      if head[1] then
        redis.call('ZREM', KEYS[3], head[1])
        table.insert(woken, head[1])
      end
    end
  end
else
  return redis.error_reply('force_release: unsupported primitive ' .. tostring(primitive))
end
redis.call('PUBLISH', KEYS[1], cjson.encode({primitive = primitive, freed = true, forced = true}))
return reply(OK, {released = released, woken = woken})
