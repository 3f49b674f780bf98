-- _stored_reply.lua — the wrapper of every retry-safe operation (admit, lock_admit, release,
-- lock_release, extend, ordered_position): coordination/stored_replies.py wraps the operation's
-- whole text at the body line below (it becomes one function) and adds to each call one key and
-- two arguments.
--
-- KEYS[#KEYS]    the stored-reply key of this call's request id: it carries the hash tag of the
--                call's first key, so it lives in the same cluster slot as the keys the
--                operation touches (a script may only touch keys of one slot)
-- ARGV[#ARGV-1]  how long the reply is kept, ms
-- ARGV[#ARGV]    "1": look for a stored reply first; "0": this is the request's first send,
--                made once by the client itself, so no reply can be stored under its id yet
--                and the GET is skipped (one Redis call less on every first send; a resend,
--                and every path where redis-py may resend on its own, says "1")
--
-- The operation gets KEYS and ARGV without them (copies, passed as its parameters of those
-- names: the server's own tables are left as they are), so it sees the arguments it was
-- written for. A reply already stored under the key is the answer of an earlier call with the
-- same request id — one whose reply the client never read (connection lost, timeout): it is
-- answered again and the operation does not run a second time. Otherwise the operation runs
-- and its answer is stored (MessagePack keeps every integer digit and an error reply's shape).
local stored_reply_key = KEYS[#KEYS]
local stored_reply_ttl_ms = tonumber(ARGV[#ARGV - 1])
if ARGV[#ARGV] ~= '0' then
  local stored_reply = redis.call('GET', stored_reply_key)
  if stored_reply then return cmsgpack.unpack(stored_reply) end
end
local operation_keys, operation_argv = {}, {}
for i = 1, #KEYS - 1 do operation_keys[i] = KEYS[i] end
for i = 1, #ARGV - 2 do operation_argv[i] = ARGV[i] end
local answer = (function(KEYS, ARGV)
-- @stored_reply_body
end)(operation_keys, operation_argv)
redis.call('SET', stored_reply_key, cmsgpack.pack(answer), 'PX', stored_reply_ttl_ms)
return answer
