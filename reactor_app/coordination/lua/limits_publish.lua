--[[ limits_publish.lua — publish the whole set of live-limit overrides, unless a newer set is
already there (coordination/live_limits.py, "publish").

Two operators' changes publish concurrently: each reads the database's overrides and writes
them here, and without an order the set read first could land last — a stale value every
process would then obey until the next change. So each publisher takes a ticket (HINCRBY of
the hash's "\0sequence" field) *before* it reads the database, and a set is written only if no
set of a later ticket was: the set with the highest ticket was read after every change whose
publisher took a lower one had committed, so it is never older than any of them.

KEYS[1]  the overrides hash ({prefix}:limits): "<primitive>:<name>" -> json payload, plus
         "\0sequence" (the last ticket handed out) and "\0published" (the ticket of the set
         in it)
ARGV[1]  the publisher's ticket
ARGV[2]  json object "<primitive>:<name>" -> payload: the whole set (replaces every override)

Returns 1 when the set was written, 0 when a set of a later ticket had been written already.
]]

local hash, ticket = KEYS[1], tonumber(ARGV[1])
local published = tonumber(redis.call('HGET', hash, '\0published') or '0')
if published >= ticket then return 0 end
-- a hash lost since the ticket was taken (a restart without persistence) restarts its tickets
-- above this one, so the next publisher's set is not refused as older
local sequence = math.max(tonumber(redis.call('HGET', hash, '\0sequence') or '0'), ticket)
redis.call('DEL', hash)
local fields = {'\0sequence', sequence, '\0published', ticket}
for field, payload in pairs(cjson.decode(ARGV[2])) do
  fields[#fields + 1] = field
  fields[#fields + 1] = payload
end
redis.call('HSET', hash, unpack(fields))
return 1
