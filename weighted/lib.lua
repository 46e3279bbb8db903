-- The algorithms of package weighted, shared by debit.lua and settle.lua,
-- which are appended to this file. They mirror state.go line for line: every
-- number is an integer held in a double, and every product stays below 2^51
-- (Limit.Validate sees to it), so the arithmetic is exact.
--
-- Times are microseconds. An item is a table {algo, cap, rate, period, tick,
-- p, cost}, with p = period / tick. A meter or window key holds one string of
-- three little-endian int64 (meter: ts, d, p; window: w, prev, curr); a
-- sliding log or concurrency key holds a sorted set scored by ts whose
-- members are "cost:id".

local TOKEN_BUCKET, GCRA, SLIDING_WINDOW, FIXED_WINDOW, SLIDING_LOG, CONCURRENCY = 0, 1, 2, 3, 4, 5
local floor = math.floor

local function ceil_div(a, b)
  return floor((a + b - 1) / b)
end

-- ttl_pad lengthens every TTL when a test overrides the time (see now_us):
-- Redis expires keys by its own clock, not by the test's, and a key kept
-- longer than its state lasts reads as empty anyway.
local ttl_pad = 0

-- now_us returns the server's time, or override when a test gives one.
local function now_us(override)
  if override > 0 then
    ttl_pad = 60000
    return override
  end
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end

-- read_items reads n items from buf at pos: algo, cap, rate, period, tick,
-- cost and, with_actual, the actual cost; it adds p as field 6.
local function read_items(buf, pos, n, with_actual)
  local items = {}
  for i = 1, n do
    local algo, cap, rate, period, tick, cost, actual
    if with_actual then
      algo, cap, rate, period, tick, cost, actual, pos = struct.unpack('<i8i8i8i8i8i8i8', buf, pos)
    else
      algo, cap, rate, period, tick, cost, pos = struct.unpack('<i8i8i8i8i8i8', buf, pos)
    end
    items[i] = {algo, cap, rate, period, tick, period / tick, cost, actual}
  end
  return items
end

local function is_string_state(algo)
  return algo <= FIXED_WINDOW
end

local function pack3(a, b, c)
  return struct.pack('<i8i8i8', a, b, c)
end

-- ttl_ms converts a µs TTL to the milliseconds of PX, rounding up.
local function ttl_ms(us)
  return ceil_div(us, 1000) + ttl_pad
end

-- Meter (TokenBucket, GCRA): see spec.meterAt.
local function meter_at(it, v, now)
  if not v then
    return now, 0
  end
  local ts, d, p = struct.unpack('<i8i8i8', v)
  if d == 0 then
    return now, 0
  end
  local full = it[2] * it[6]
  if p ~= it[6] then
    local f = math.ceil(d * it[6] / p)
    if f >= full then d = full else d = f end
  end
  if d > full then d = full end
  if now > ts then
    local e = floor((now - ts) / it[5])
    if e > 0 then
      if e >= ceil_div(d, it[3]) then
        return now, 0
      end
      d = d - e * it[3]
      ts = ts + e * it[5]
    end
  end
  return ts, d
end

local function meter_reset(it, ts, d, now)
  if d == 0 then
    return 0
  end
  return ts + ceil_div(d, it[3]) * it[5] - now
end

-- Window (FixedWindow, SlidingWindow): see spec.windowAt.
local function window_at(it, v, now)
  local w = floor(now / it[4])
  if not v then
    return w, 0, 0, w * it[4]
  end
  local sw, sprev, scurr = struct.unpack('<i8i8i8', v)
  if sw > w and scurr + sprev > 0 then
    w = sw
  end
  local prev, curr = 0, 0
  if sw == w then
    prev, curr = sprev, scurr
  elseif sw == w - 1 then
    prev = scurr
  end
  return w, prev, curr, w * it[4]
end

local function window_reset(it, prev, curr, start, now)
  if it[1] == FIXED_WINDOW then
    if curr > 0 then return start + it[4] - now end
    return 0
  end
  if curr > 0 then return start + 2 * it[4] - now end
  if prev > 0 then return start + it[4] - now end
  return 0
end

-- evaluate returns allowed (0/1), remaining, retry and reset for cost at now,
-- and what the debit would write: for a meter or window the new packed value
-- and its TTL in µs (0: delete), for marks nothing (debit_marks recomputes).
-- after: describe the state after the debit when it fits.
local function evaluate(it, v, key, now, cost, after)
  local algo, cap, p = it[1], it[2], it[6]
  if algo == TOKEN_BUCKET or algo == GCRA then
    local ts, d = meter_at(it, v, now)
    local full = cap * p
    local ok, retry = 0, 0
    local nd = d + cost * p
    if nd <= full then
      ok = 1
      if after then d = nd end
    else
      retry = ts + ceil_div(d - (cap - cost) * p, it[3]) * it[5] - now
    end
    local reset = meter_reset(it, ts, d, now)
    return ok, floor((full - d) / p), retry, reset, pack3(ts, nd, p), meter_reset(it, ts, nd, now)
  end
  if algo == FIXED_WINDOW then
    local w, _, curr, start = window_at(it, v, now)
    local ok, retry, ncurr = 0, 0, curr + cost
    if ncurr <= cap then
      ok = 1
      if after then curr = ncurr end
    else
      retry = start + it[4] - now
    end
    return ok, cap - curr, retry, window_reset(it, 0, curr, start, now),
      pack3(w, 0, ncurr), window_reset(it, 0, ncurr, start, now)
  end
  if algo == SLIDING_WINDOW then
    local w, prev, curr, start = window_at(it, v, now)
    local e = now - start
    if e < 0 then e = 0 end
    e = floor(e / it[5])
    local full = cap * p
    local used = curr * p + prev * (p - e)
    local ok, retry, ncurr = 0, 0, curr + cost
    if ncurr <= cap and used + cost * p <= full then
      ok = 1
      if after then
        curr = ncurr
        used = used + cost * p
      end
    else
      local target
      if ncurr <= cap then
        target = start + (p - floor((cap - curr - cost) * p / prev)) * it[5]
      else
        target = start + it[4] + (p - floor((cap - cost) * p / curr)) * it[5]
      end
      retry = target - now
    end
    local rem = full - used
    if rem < 0 then rem = 0 end
    return ok, floor(rem / p), retry, window_reset(it, prev, curr, start, now),
      pack3(w, prev, ncurr), window_reset(it, prev, ncurr, start, now)
  end
  -- Marks: a sliding log counts marks with ts > now - period and adds one at
  -- now; a concurrency limit counts marks with ts > now (live leases) and
  -- adds one expiring at now + period.
  local lo, lag = now, 0
  if algo == SLIDING_LOG then
    lo, lag = now - it[4], it[4]
  end
  local marks = redis.call('ZRANGEBYSCORE', key, '(' .. string.format('%d', lo), '+inf', 'WITHSCORES')
  local sum, newest = 0, 0
  for i = 1, #marks, 2 do
    local ts = tonumber(marks[i + 1])
    sum = sum + tonumber(string.match(marks[i], '^(%d+):'))
    if ts > newest then newest = ts end
  end
  local ok, retry = 0, 0
  if sum + cost <= cap then
    ok = 1
    if after and cost > 0 then
      sum = sum + cost
      local hi = now
      if algo == CONCURRENCY then hi = now + it[4] end
      if hi > newest then newest = hi end
    end
  else
    local need, acc = sum + cost - cap, 0
    for i = 1, #marks, 2 do
      acc = acc + tonumber(string.match(marks[i], '^(%d+):'))
      if acc >= need then
        retry = tonumber(marks[i + 1]) + lag - now
        break
      end
    end
  end
  local reset = 0
  if sum > 0 then reset = newest + lag - now end
  return ok, cap - sum, retry, reset
end

local function member(cost, id)
  return string.format('%d', cost) .. ':' .. id
end

-- marks_ttl sets the key's TTL to when its last mark stops counting, or
-- leaves the key to go when it has no marks left.
local function marks_ttl(it, key, now)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #last == 0 then
    return
  end
  local lag = 0
  if it[1] == SLIDING_LOG then lag = it[4] end
  redis.call('PEXPIRE', key, ttl_ms(tonumber(last[2]) + lag - now))
end

-- debit_marks adds an admitted debit to a sliding log or concurrency key.
local function debit_marks(it, key, now, cost, id)
  local lo, hi = now - it[4], now
  if it[1] == CONCURRENCY then
    lo, hi = now, now + it[4]
  end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', lo)
  redis.call('ZADD', key, hi, member(cost, id))
  marks_ttl(it, key, now)
end

-- set_value writes a meter or window value, or deletes the key when its
-- state is empty (ttl 0).
local function set_value(key, value, ttl)
  if ttl > 0 then
    redis.call('SET', key, value, 'PX', ttl_ms(ttl))
  else
    redis.call('DEL', key)
  end
end

-- record_ttl: see spec.recordTTL.
local function record_ttl(it, now)
  local start = floor(now / it[4]) * it[4]
  if it[1] == SLIDING_WINDOW then
    return start + 2 * it[4] - now
  end
  return start + it[4] - now
end
