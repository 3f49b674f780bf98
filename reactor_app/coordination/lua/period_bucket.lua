--[[ period_bucket.lua — the dedup bucket holding a moment (for state readers and tests).

The very calendar code admit and release use, so readers never disagree with admission.

ARGV[1]  every: "second" | "minute" | "hour" | "day" | "week" | "month" | "year" | seconds
ARGV[2]  epoch seconds to place, or "" for the Redis time now

Returns {status, json}:
  0 OK         {bucket = start epoch s, bucket_end = end epoch s, at = epoch s placed}
  9 NOT_FOUND  {} — unknown unit
]]

-- @include _common.lua
-- @include _calendar.lua

local at = tonumber(ARGV[2] or '')
if not at then at = redis_now().seconds end
local start, finish = period_bucket(ARGV[1], at)
if not start then return reply(NOT_FOUND, {}) end
return reply(OK, {bucket = start, bucket_end = finish, at = at})
