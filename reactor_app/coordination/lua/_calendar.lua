-- _calendar.lua — fragment: dedup-period buckets (docs/design.md §2.6 "Period").
-- Named units are calendar-aligned UTC buckets; integer seconds are epoch-aligned.
-- Dates use the proleptic Gregorian calendar (days counted from 1970-01-01).

local UNIT_SECONDS = {second = 1, minute = 60, hour = 3600, day = 86400}

-- days since 1970-01-01 of the civil date y-m-d
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local year_of_era = y - era * 400
  local month_from_march = (m + 9) % 12
  local day_of_year = math.floor((153 * month_from_march + 2) / 5) + d - 1
  local day_of_era = year_of_era * 365 + math.floor(year_of_era / 4)
    - math.floor(year_of_era / 100) + day_of_year
  return era * 146097 + day_of_era - 719468
end

-- civil date (y, m, d) of a day count since 1970-01-01
local function civil_from_days(days)
  local z = days + 719468
  local era = math.floor(z / 146097)
  local day_of_era = z - era * 146097
  local year_of_era = math.floor((day_of_era - math.floor(day_of_era / 1460)
    + math.floor(day_of_era / 36524) - math.floor(day_of_era / 146096)) / 365)
  local day_of_year = day_of_era - (365 * year_of_era + math.floor(year_of_era / 4)
    - math.floor(year_of_era / 100))
  local month_from_march = math.floor((5 * day_of_year + 2) / 153)
  local d = day_of_year - math.floor((153 * month_from_march + 2) / 5) + 1
  local m = month_from_march < 10 and month_from_march + 3 or month_from_march - 9
  local y = year_of_era + era * 400
  if m <= 2 then y = y + 1 end
  return y, m, d
end

-- The bucket holding epoch second now_s for `every`: start and end epoch seconds.
-- Returns nil for an unknown unit (the Python side validates `every` long before).
local function period_bucket(every, now_s)
  local size = UNIT_SECONDS[every] or tonumber(every)
  if size then
    local start = math.floor(now_s / size) * size
    return start, start + size
  end
  local days = math.floor(now_s / 86400)
  if every == 'week' then
    -- ISO weeks start on Monday; 1970-01-01 was a Thursday (Monday-based weekday 3)
    local monday = days - (days + 3) % 7
    return monday * 86400, (monday + 7) * 86400
  end
  local y, m = civil_from_days(days)
  if every == 'month' then
    local next_y, next_m = y, m + 1
    if next_m == 13 then next_y, next_m = y + 1, 1 end
    return days_from_civil(y, m, 1) * 86400, days_from_civil(next_y, next_m, 1) * 86400
  end
  if every == 'year' then
    return days_from_civil(y, 1, 1) * 86400, days_from_civil(y + 1, 1, 1) * 86400
  end
  return nil, nil
end
