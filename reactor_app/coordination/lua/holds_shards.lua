#!lua flags=no-writes,allow-cross-slot-keys
--[[ holds_shards.lua — one Redis Cluster master's part of a live-holds listing (read only).

On a cluster the live-holds index is sharded by hash slot (coordination/holds_index.py); a
listing runs this script once on every master, over the shards of the slots that master serves
(the only script that reads keys of several slots: legal within one node with the
allow-cross-slot-keys flag, Redis 7, for keys it is not given in KEYS — the server requires
the KEYS of one call to share a slot). The shard names are built here from the slot numbers and
SLOT_TAGS, the hash tag of every slot, spliced in by holds_index.py where the marker line below
stands (sending 5,000+ names per call cost the client more than the whole read). Members are
never compared here (Lua's string order follows the server's locale): the caller sorts.

KEYS     none
ARGV[1]  "asc" | "desc" (score order), "lex" (by key) or "counts"
ARGV[2..4]
  asc/desc  the cursor's score ("" at the start), k (a page's batch), ""
  lex       the ZRANGEBYLEX bounds (low, after the cursor; high), k
  counts    "", "", ""
ARGV[5]  the key prefix; ARGV[6] the shard key's suffix ("time", "ttl", "keys"; for "counts"
         "time": the zset counted, beside the same shard's counts hash)
ARGV[7]  the slots this master serves, as ranges "first-last,first-last,..."

Returns a flat list:
  asc/desc  {head, ncaps, (cap member, cap score) * ncaps, (member, score) ...}: every entry
            past the cursor's score up to `head` — the k-th nearest of the shards' first
            entries past the cursor ("" when fewer than k shards have one: no bound) — except
            that a shard gives at most k, its last one then a cap (answered up to there);
            plus every entry AT the cursor's score (the caller drops those it passed)
  lex       {ncaps, cap members..., members...}: at most k members per shard within the
            bounds, a shard that gave k capped at its last
  counts    {"all", holds, primitive, count, ...} summed over the shards: every entry (the
            by-time zsets' sizes), and the counts hash's fields (semaphores)
]]

-- @slot-tags
local mode = ARGV[1]
local shards = {}
for first, last in string.gmatch(ARGV[7], '(%d+)-(%d+)') do
  for slot = tonumber(first), tonumber(last) do
    table.insert(shards, ARGV[5] .. ':holds:{' .. SLOT_TAGS[slot + 1] .. '}:' .. ARGV[6])
  end
end

if mode == 'counts' then
  local sums, order = {all = 0}, {'all'}
  for _, name in ipairs(shards) do
    sums.all = sums.all + redis.call('ZCARD', name)
    local flat = redis.call('HGETALL', string.sub(name, 1, -5) .. 'counts')
    for i = 1, #flat, 2 do
      if not sums[flat[i]] then
        sums[flat[i]] = 0
        table.insert(order, flat[i])
      end
      sums[flat[i]] = sums[flat[i]] + tonumber(flat[i + 1])
    end
  end
  local out = {}
  for _, primitive in ipairs(order) do
    table.insert(out, primitive)
    table.insert(out, tostring(sums[primitive]))
  end
  return out
end

if mode == 'lex' then
  local low, high, k = ARGV[2], ARGV[3], tonumber(ARGV[4])
  local caps, found = {}, {}
  for _, name in ipairs(shards) do
    local got = redis.call('ZRANGEBYLEX', name, low, high, 'LIMIT', 0, k)
    for _, entry in ipairs(got) do table.insert(found, entry) end
    if #got == k then table.insert(caps, got[k]) end
  end
  local out = {#caps}
  for _, entry in ipairs(caps) do table.insert(out, entry) end
  for _, entry in ipairs(found) do table.insert(out, entry) end
  return out
end

local desc = mode == 'desc'
local cursor, k = ARGV[2], tonumber(ARGV[3])
local far = desc and '-inf' or '+inf'
local past = cursor == '' and (desc and '+inf' or '-inf') or '(' .. cursor

local function range(name, from, to, limit)
  if desc then
    return redis.call('ZREVRANGEBYSCORE', name, from, to, 'WITHSCORES', 'LIMIT', 0, limit)
  end
  return redis.call('ZRANGEBYSCORE', name, from, to, 'WITHSCORES', 'LIMIT', 0, limit)
end

local entries, heads = {}, {}
for i, name in ipairs(shards) do
  local got
  if cursor == '' then
    got = range(name, past, far, 1)
  else
    got = range(name, cursor, far, 1)
    if got[1] and tonumber(got[2]) == tonumber(cursor) then
      local ties = redis.call('ZRANGEBYSCORE', name, cursor, cursor, 'WITHSCORES')
      for j = 1, #ties do table.insert(entries, ties[j]) end
      got = range(name, past, far, 1)
    end
  end
  if got[1] then table.insert(heads, {i, tonumber(got[2]), got[2]}) end
end

local head, bound = '', nil
if #heads >= k then
  table.sort(heads, function(a, b)
    if desc then return a[2] > b[2] end
    return a[2] < b[2]
  end)
  bound, head = heads[k][2], heads[k][3]
end

local caps = {}
for _, first in ipairs(heads) do
  if bound == nil or (desc and first[2] >= bound) or (not desc and first[2] <= bound) then
    local got = range(shards[first[1]], past, bound == nil and far or head, k)
    for j = 1, #got do table.insert(entries, got[j]) end
    if #got == 2 * k then
      table.insert(caps, got[2 * k - 1])
      table.insert(caps, got[2 * k])
    end
  end
end

local out = {head, #caps / 2}
for _, entry in ipairs(caps) do table.insert(out, entry) end
for _, entry in ipairs(entries) do table.insert(out, entry) end
return out
