--[[ _library.lua — the frame of the Redis Functions library (Redis 7+), which
coordination/function_library.py fills in: every operation of lua/ as one function of one
library, loaded once per server with FUNCTION LOAD and called with FCALL.

Why a library: an EVALSHA script runs its whole text on every call, so every call of admit.lua
defined again the forty-odd helpers of the fragments it includes (each closure and table costs
the server time; docs/benchmarks.md). In the library the fragments are spliced in once, at its
top level (the `-- @fragments` line): their helpers are defined when the library loads, and a
call runs only its operation's own text.

KEYS and ARGV: the operations and the fragments read them as the globals an EVALSHA script has.
A function gets them as arguments instead, and may not set globals; so they are the library's
two locals below, set by each function before its operation's text runs. The server runs one
function at a time and a function never yields, so no call sees another's.

Each operation's text becomes the body of one local function, registered under its name in the
library (`-- @operations`, one `do` block each: an operation's own locals stay its own). A
retry-safe operation's body runs inside `stored_reply` below: the same contract as
_stored_reply.lua (the last key is the stored-reply key, the last two arguments its lifetime
and whether to look for a stored reply first; taken off before the operation sees KEYS and
ARGV).
]]

local KEYS, ARGV

-- @fragments

-- The stored-reply frame of a retry-safe operation (_stored_reply.lua says what and why): a
-- reply already stored under the call's request id is answered again, the operation not run.
local function stored_reply(body)
  local stored_reply_key = KEYS[#KEYS]
  local stored_reply_ttl_ms = tonumber(ARGV[#ARGV - 1])
  if ARGV[#ARGV] ~= '0' then
    local stored = redis.call('GET', stored_reply_key)
    if stored then return cmsgpack.unpack(stored) end
  end
  KEYS[#KEYS], ARGV[#ARGV], ARGV[#ARGV - 1] = nil, nil, nil
  local answer = body()
  redis.call('SET', stored_reply_key, cmsgpack.pack(answer), 'PX', stored_reply_ttl_ms)
  return answer
end

-- @operations
