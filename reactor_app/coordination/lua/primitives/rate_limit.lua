--[[ primitives/rate_limit.lua — the rate limit's part of the general scripts: its `admit`
section is spliced into admit.lua and `release` into release.lua. How, and what a section may
use: docs/architecture.md, "Adding a primitive". ]]

-- @section admit

-- the cost a sliding-window member carries: "<us>-<seq>*<cost>", or 1 without "*"
local function member_cost(member)
  local c = string.match(member, '%*(%d+)$')
  return c and tonumber(c) or 1
end

-- the running total of a sliding window after purging its expired members, O(expired); the
-- total is rebuilt from the members (O(n), once) when its member count disagrees with the
-- zset's: the total key expired, or an admission was made without it. Returns the total and the
-- window's state: its total and member count, and whether the stored total is behind them (a
-- purge or a rebuild). It is written once: by the take when the claim is admitted, folded into
-- the charge's own write, else by store_totals when the admission is refused.
local function window_total(name, total_key, cutoff_us, window_ms)
  local stored = redis.call('HMGET', total_key, 'cost', 'n')
  local total, n = tonumber(stored[1]), tonumber(stored[2])
  local behind = false
  local expired = redis.call('ZRANGEBYSCORE', name, '-inf', cutoff_us)
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', name, '-inf', cutoff_us)
    behind = true
    if total then
      for _, member in ipairs(expired) do total = total - member_cost(member) end
      n = n - #expired
    end
  end
  local card = redis.call('ZCARD', name)
  if not total or n ~= card then
    total = 0
    for _, member in ipairs(redis.call('ZRANGE', name, 0, -1)) do
      total = total + member_cost(member)
    end
    n, behind = card, true
  end
  -- (`made`: no total was stored, so the take's write makes the hash, without a lifetime)
  return total, {key = total_key, total = total, n = n, behind = behind, ms = window_ms,
                 made = not stored[1]}
end

-- A sliding window's zset and running total live a window past their newest member. Setting
-- both lifetimes is two PEXPIREs per window per admission; so an admission that sets them sets
-- them a quarter of a window longer than needed (LIFETIME_SPARE), and the admissions after it
-- set them again only once the zset's lifetime (one PTTL) no longer covers a window from now
-- (keep_until in _common.lua; docs/coordination.md, "How long a window's keys live"). The
-- zset's own lifetime is read, never a record of it: whatever else sets it (a refusal setting
-- the total's alone, an older version of this library during a rolling deploy), a member is
-- never lost before it leaves its window. The total may go first (a refusal set it alone): it
-- is rebuilt from the members.
local LIFETIME_SPARE = 4 -- a quarter of the window
local function window_needs(window_ms) return math.ceil(window_ms) + 1 end
local function window_spare(window_ms) return math.floor(window_ms / LIFETIME_SPARE) end

-- write the running totals a refused admission's checks brought up to date (window_total)
local function store_totals(windows)
  for _, w in ipairs(windows) do
    if w.behind then
      if w.n == 0 then
        redis.call('DEL', w.key)
      else
        redis.call('HSET', w.key, 'cost', w.total, 'n', w.n)
        redis.call('PEXPIRE', w.key, math.ceil(w.ms) + 1)
      end
    end
  end
end

-- when enough cost has left the window for `need` more units: the oldest members leave first,
-- so walk them in admission order until their costs add up to `need` (O(members walked))
local function departure_us(name, need)
  local start, batch, departed = 0, 128, 0
  while true do
    local entries = redis.call('ZRANGE', name, start, start + batch - 1, 'WITHSCORES')
    if #entries == 0 then return nil end
    for j = 1, #entries, 2 do
      departed = departed + member_cost(entries[j])
      if departed >= need then return tonumber(entries[j + 1]) end
    end
    start = start + batch
  end
end

local function check_rate_limit(claim)
  local worst = nil
  local cost = claim.cost or 1
  local totals = 1 + #claim.windows + (claim.stored and 1 or 0)
  local states = {} -- a sliding window's running total (window_total), for the take
  for i, window in ipairs(claim.windows) do
    local name = claim.keys[i + 1]
    local count, retry_us
    if claim.strategy == 'fixed' then
      count = tonumber(redis.call('GET', name) or '0')
      if count + cost > window.limit then
        local ttl = redis.call('PTTL', name)
        retry_us = (ttl > 0 and ttl or 1) * 1000
      end
    else
      local window_us = window.ms * 1000
      -- an entry admitted at t counts while now < t + window
      count, states[i] = window_total(name, claim.keys[totals + i], int(now.us - window_us),
        window.ms)
      if count + cost > window.limit then
        -- the entry whose departure leaves room for this cost
        local at = departure_us(name, count + cost - window.limit)
        retry_us = at and (at + window_us - now.us) or window_us
      end
    end
    if retry_us and (not worst or retry_us > worst.retry_us) then
      worst = {retry_us = retry_us, limit = window.limit, label = window.label,
               window_ms = window.ms, count = count}
    end
  end
  if worst then
    store_totals(states)
    return nil, refusal(RATE_LIMITED, {
      retry_after_ms = worst.retry_us / 1000, limit = worst.limit, label = worst.label,
      window_ms = worst.window_ms, count = worst.count, cost = cost,
    })
  end
  -- a later claim's refusal writes them instead (admit.lua)
  return {windows = states, on_refused = function() store_totals(states) end}
end

-- the limits travel with each admission; keep them beside the counts so operators see them.
-- Their lifetime (at least the longest window's, never shortened) is checked when `lifetime_ms`
-- is given — a fixed limit's take passes 0, a sliding one's the lifetime it set its windows'
-- keys to, if it did — and whenever the hash gains a field (a new hash, or a window it did not
-- show).
local function store_windows(claim, lifetime_ms)
  if not claim.stored then return end
  local name = claim.keys[#claim.windows + 2]
  local longest = 0
  local fields = {} -- every window in one HSET
  for _, window in ipairs(claim.windows) do
    fields[#fields + 1] = window.label
    fields[#fields + 1] = cjson.encode(
      {seconds = window.ms / 1000, limit = window.limit, strategy = claim.strategy})
    longest = math.max(longest, window.ms)
  end
  local added = redis.call('HSET', name, unpack(fields))
  if not lifetime_ms and added == 0 then return end
  lifetime_ms = math.max(lifetime_ms or 0, math.ceil(longest) + 1)
  if redis.call('PTTL', name) < lifetime_ms then redis.call('PEXPIRE', name, lifetime_ms) end
end

local function take_rate_limit(claim, plan)
  local cost = claim.cost or 1
  if claim.strategy == 'fixed' then
    store_windows(claim, 0) -- a fixed window's counters are set apart: checked every time
    for i, window in ipairs(claim.windows) do
      local name = claim.keys[i + 1]
      redis.call('INCRBY', name, cost)
      if redis.call('PTTL', name) < 0 then
        -- windows are aligned on the epoch, so every process agrees on their edges
        redis.call('PEXPIRE', name, math.max(window.ms - now.ms % window.ms, 1))
      end
    end
    return {fresh = true}
  end
  -- members must be unique even for admissions within one microsecond
  local seq = redis.call('INCR', claim.keys[1])
  local member = int(now.us) .. '-' .. seq
  -- the cost travels in the member, so a purge knows what leaves with it
  if cost ~= 1 then member = member .. '*' .. cost end
  local set_ms = nil -- the longest lifetime set below, if any
  for i, window in ipairs(claim.windows) do
    local name = claim.keys[i + 1]
    redis.call('ZADD', name, int(now.us), member)
    -- the check just brought the total up to date (window_total): it is written once, with
    -- this charge in it, so it stays exact
    local w = plan.windows[i]
    redis.call('HSET', w.key, 'cost', w.total + cost, 'n', w.n + 1)
    -- (a zset this ZADD made has no lifetime: -1 falls short; a total this HSET made, `made`)
    local kept = keep_until(name, w.key, now.ms + window_needs(window.ms), now.ms,
      window_spare(window.ms), w.made)
    if kept then set_ms = math.max(set_ms or 0, kept) end
  end
  -- the sequence and the shown limits live as long as the longest window's keys: set with
  -- theirs (and the sequence's when INCR made it)
  if set_ms or seq == 1 then
    local longest = 0
    for _, window in ipairs(claim.windows) do longest = math.max(longest, window.ms) end
    redis.call('PEXPIRE', claim.keys[1], window_needs(longest) + window_spare(longest))
  end
  store_windows(claim, set_ms)
  return {fresh = true, member = member}
end

CHECK['rate_limit'], TAKE['rate_limit'] = check_rate_limit, take_rate_limit

-- @section release

local function release_rate_limit(keys, spec)
  if outcome ~= 'give_back' then return end -- a charge is spent once the work was admitted
  local cost = spec.cost or 1
  local windows = spec.w or #keys
  for i = 1, windows do
    local name = keys[i]
    if spec.strategy == 'fixed' then
      local count = tonumber(redis.call('GET', name) or '0')
      if count > 0 then redis.call('DECRBY', name, math.min(cost, count)) end
    elseif spec.member then
      local total_key = keys[windows + i]
      -- the running total follows its member out (a missing total is rebuilt on next check)
      if redis.call('ZREM', name, spec.member) == 1 and total_key
          and redis.call('EXISTS', total_key) == 1 then
        redis.call('HINCRBY', total_key, 'cost', -cost)
        redis.call('HINCRBY', total_key, 'n', -1)
      end
    end
  end
end

RELEASE['rate_limit'] = release_rate_limit
