-- The algorithms of package weighted, shared by debit.lua and settle.lua,
-- which run in batch.lua's loop, appended to this file. They mirror
-- state.go: every number is an integer held in a double, and every product
-- stays below 2^51
-- (Limit.Validate sees to it), so the arithmetic is exact.
--
-- Times are µs. An item is algo, cap, rate, period, tick and cost (and, to
-- settle, the actual cost), with p = period / tick ticks per period. A meter
-- or fixed window key holds one string of four little-endian doubles
-- (meter: ts, d, p; fixed window: w, wp, curr, wp being the period w was
-- counted with, in place of the previous count a fixed window never has;
-- then the key's expiry in ms), which struct reads faster than int64 and
-- which hold these integers exactly; a sliding window key holds five (w,
-- prev, curr, the expiry, then wp). See window for the windows of older
-- versions. A fixed window on calendar months (algo MONTH_WINDOW, period
-- the longest month) holds w, -1, curr and the expiry, w being the month's
-- index (see window). A sliding log or concurrency key holds a sorted set (see
-- marks_sum). The keys of meters and windows come first in KEYS.
--
-- The script body runs on every call, so it defines few functions up front
-- and inlines the hottest paths: each definition costs a closure per call.

-- MONTH_WINDOW is a fixed window on UTC calendar months (see window).
local TOKEN_BUCKET, GCRA, SLIDING_WINDOW, FIXED_WINDOW, SLIDING_LOG, CONCURRENCY, MONTH_WINDOW = 0, 1, 2, 3, 4, 5, 6
-- How long a final debit's (op 7) reservation record lives, in ms (Go's
-- FinalRecordTTL).
local FINAL_RECORD_MS = 10000
-- How many of a sliding log's or concurrency limit's oldest counting marks
-- a denial reads to tell its Retry-After (Go's maxRetryWalk).
local MAX_RETRY_WALK = 256
-- How many sliding log and concurrency limit marks that stopped counting
-- one request drops, all its keys together (Go's maxTrim): request.lua
-- sets L.trims to it.
local MAX_TRIM = 1024
local floor, pack, sunpack = math.floor, struct.pack, struct.unpack

-- The script's time, set by set_now first. ttl_pad lengthens every TTL when
-- a test overrides the time: Redis expires keys by its own clock, not the
-- test's, and a key kept longer than its state lasts reads as empty anyway.
local now, now_ms, ttl_pad = 0, 0, 0

local function set_now(override)
  if override > 0 then
    now, ttl_pad = override, 60000
  else
    local t = redis.call('TIME')
    now = t[1] * 1000000 + t[2]
  end
  now_ms = floor(now / 1000)
end

-- Integer division of non-negative integers: (a - a % b) / b is floor(a / b)
-- without calling C, and exact, since a % b is computed from the exact
-- floor(a / b) of integers below 2^53. The hot paths spell it out.
local function ceil_div(a, b)
  local c = a + b - 1
  return (c - c % b) / b
end

-- The rest is made on first use, by lib(): every function the script body
-- defines costs a closure on every call, and the token bucket and fixed
-- window debits, spelled out in debit.lua, need none of these.
local L = false

local function lib()
  if L then
    return L
  end
  -- store returns how a meter or window (a, b, c) is written: its packed
  -- value and its PX in ms, 0 to keep the key's TTL, or -1 to delete the key
  -- because the state is empty (ttl, the µs until it is, is 0). The key's
  -- expiry, kept in the value as exp (ms), moves only when it would come
  -- before the state is empty, and then min(period, 60 s) later than needed,
  -- so that most writes keep the key's TTL: overwriting a value costs Redis
  -- less than half what SET with PX does. A sliding window (win set) also
  -- keeps its period, as a fifth double.
  local function store(a, b, c, ttl, exp, period, win)
    if ttl <= 0 then
      return false, -1
    end
    local need = ceil_div(now + ttl, 1000)
    local px = 0
    if need > exp then
      local slack = floor(period / 1000)
      if slack > 60000 then slack = 60000 elseif slack < 1 then slack = 1 end
      exp = need + slack
      px = exp - now_ms + ttl_pad
    end
    if win then
      return pack('<ddddd', a, b, c, exp, period), px
    end
    return pack('<dddd', a, b, c, exp), px
  end

  -- A batch of more than one request reads each meter or window key once
  -- and writes it once: batch.lua calls batch, and the requests read and
  -- write the keys' values through C. C holds each key's value as a
  -- request would GET it now: the string, false when the key is absent (a
  -- GET found nothing, or a request deleted it), 0 when MGET found no
  -- string (absent, or of another type, which GET would reject), nil when
  -- not read yet. D[1] to D[ndirty] are the keys written since the last
  -- flush, and P[key] how flush writes key, as store gives a PX: > 0 to set
  -- the value with that TTL, 0 to keep the key's TTL, -1 to delete it; it
  -- is the last write's, except that a write that keeps the TTL keeps the
  -- PX of a write before it. flush so leaves each key with the value and
  -- TTL that the writes one by one would have left. (A write that keeps
  -- the TTL never follows a delete: an absent key has no expiry to keep.)
  -- It runs before any command that may fail (a key of the wrong type, or
  -- a value too short to read), so that the requests before a failing one
  -- keep their writes, and at the end of the batch. Sorted sets are not
  -- cached. A lone request (C false) reads and writes Redis directly.
  -- These live in lib, not in the script body: every local of the body
  -- that lib's functions use costs every call an upvalue.
  local C, P, D, ndirty = false, false, false, 0

  -- batch starts a batch's cache and returns C.
  local function batch()
    C, P, D = {}, {}, {}
    return C
  end

  -- flush writes the pending writes of a batch (see C) and forgets them.
  -- Keeping the TTL, it overwrites the value in place: SETRANGE is cheaper
  -- than SET with KEEPTTL, and a key's values have the same length (but
  -- for a sliding window of an older version, which it lengthens, as SET
  -- would).
  local function flush()
    for j = 1, ndirty do
      local key = D[j]
      local px = P[key]
      if px > 0 then
        redis.call('SET', key, C[key], 'PX', px)
      elseif px == 0 then
        redis.call('SETRANGE', key, 0, C[key])
      else
        redis.call('DEL', key)
      end
      P[key] = nil
    end
    ndirty = 0
  end

  -- write writes key as store described it: in a batch, as a pending write
  -- (see C), else at once, as flush does.
  local function write(key, value, px)
    if C then
      C[key] = value
      local was = P[key]
      if was == nil then
        ndirty = ndirty + 1
        D[ndirty] = key
        P[key] = px
      elseif px ~= 0 then
        P[key] = px
      end
    elseif px > 0 then
      redis.call('SET', key, value, 'PX', px)
    elseif px == 0 then
      redis.call('SETRANGE', key, 0, value)
    else
      redis.call('DEL', key)
    end
  end

  -- checked returns v, a reply of redis.pcall, after flushing a batch's
  -- pending writes when v is an error, which it raises, or a value shorter
  -- than size bytes, which the script fails to read: the script then fails
  -- after the writes of the requests before, as if they had been made at
  -- once.
  local function checked(v, size)
    if type(v) == 'table' then
      flush()
      error(v)
    end
    if v and #v < size then
      flush()
    end
    return v
  end

  -- mget returns the values of the meters and windows of a request of a
  -- batch, KEYS[k + 1] to KEYS[k + ns], reading those not in C into C.
  local function mget(k, ns)
    local vals = redis.call('MGET', unpack(KEYS, k + 1, k + ns))
    for i = 1, ns do
      local key = KEYS[k + i]
      local v = C[key]
      if v == nil then
        v = checked(vals[i], 32) or 0
        C[key] = v
      end
      if v == 0 then v = false end
      vals[i] = v
    end
    return vals
  end

  -- get returns the value of meter or window key: in a batch, from C,
  -- reading it into C first if needed.
  local function get(key)
    if not C then
      return redis.call('GET', key)
    end
    local v = C[key]
    if v == nil or v == 0 then
      v = checked(redis.pcall('GET', key), 32)
      C[key] = v
    end
    return v
  end

  -- meter reads value v of a token bucket or GCRA at now (see spec.meterAt)
  -- and returns ts, d and the key's expiry.
  local function meter(v, cap, rate, tick, p)
    if not v then
      return now, 0, 0
    end
    local ts, d, vp, exp = sunpack('<dddd', v)
    if d == 0 then
      return now, 0, exp
    end
    local most = 2 * cap * p -- the most debt: one capacity beyond empty (see spec.maxDebt)
    if vp ~= p then
      local f = math.ceil(d * p / vp)
      if f >= most then d = most else d = f end
    end
    if d > most then d = most end
    if now > ts then
      local e = now - ts
      e = (e - e % tick) / tick
      if e > 0 then
        if e >= ceil_div(d, rate) then
          return now, 0, exp
        end
        d = d - e * rate
        ts = ts + e * tick
      end
    end
    return ts, d, exp
  end

  -- window reads value v of a window of algo at now (see spec.windowAt)
  -- and returns w, prev, curr, the window's start and the key's expiry
  -- (a window on calendar months, algo MONTH_WINDOW, more, see there). A
  -- window written with another period is carried over as spec.carry
  -- does. A value of an older version has no period (a fixed window's wp
  -- is 0, a sliding window has four doubles): it is read as written with
  -- the current one, unless its window would end after its own expiry,
  -- which no write with the current period leaves (exp is at least the end
  -- of the window counted in): it was written with a shorter period, and
  -- its counts are carried into the current window.
  local function window(v, period, algo, rec)
    if algo == 6 then
      -- MONTH_WINDOW, spelled as a number: a local of the script body
      -- used here would cost every call an upvalue of lib.
      -- A window on calendar months (see month.go): its index is year *
      -- 12 + month - 1, UTC. month_index and month_start are Howard
      -- Hinnant's civil_from_days and days_from_civil, on days since
      -- 0000-03-01 in years that start on March 1st (so that February,
      -- whose length varies, comes last), with floor division spelled
      -- (a - a % b) / b. Every number is an integer below 2^53 (days, or
      -- µs up to the year 2255), so the doubles are exact. They are made
      -- here, not in lib's body, so that the other algorithms' calls pay
      -- no closures for them.
      local DAY = 86400000000
      -- month_index returns the index of the month holding t (µs).
      local function month_index(t)
        local z = (t - t % DAY) / DAY + 719468 -- days since 0000-03-01
        local era = (z - z % 146097) / 146097 -- 400-year eras
        local doe = z - era * 146097 -- [0, 146096]
        local yoe = doe - floor(doe / 1460) + floor(doe / 36524) - floor(doe / 146096)
        yoe = floor(yoe / 365) -- [0, 399]
        local doy = doe - (365 * yoe + floor(yoe / 4) - floor(yoe / 100)) -- [0, 365]
        local mp = floor((5 * doy + 2) / 153) -- months since March, [0, 11]
        -- March of year y is y * 12 + 2; January and February count in
        -- the next year, 10 and 11 months after March.
        return (era * 400 + yoe) * 12 + mp + 2
      end
      -- month_start returns the first µs of the month of index w.
      local function month_start(w)
        w = w - 2 -- months since 0000-03-01
        local mp = w % 12
        local y = (w - mp) / 12
        local yoe = y % 400
        local era = (y - yoe) / 400
        local doe = 365 * yoe + floor(yoe / 4) - floor(yoe / 100) + floor((153 * mp + 2) / 5)
        return (era * 146097 + doe - 719468) * DAY
      end
      -- The month counted in is now's, or the state's when the clock is
      -- behind it (see monthAt); it ends at stop. Besides window's five
      -- numbers (prev 0), it returns stop, the end of now's month, and
      -- rec's month (rec, µs, when given).
      local w = month_index(now)
      local start, nend = month_start(w), month_start(w + 1)
      local stop, curr, exp = nend, 0, 0
      if v then
        local sw, _, scurr
        sw, _, scurr, exp = sunpack('<dddd', v)
        if sw > w and scurr > 0 then
          w, curr = sw, scurr
          start, stop = month_start(sw), month_start(sw + 1)
        elseif sw == w then
          curr = scurr
        end
      end
      local rw = -1
      if rec then rw = month_index(rec) end
      return w, 0, curr, start, exp, stop, nend, rw
    end
    local w = (now - now % period) / period
    if not v then
      return w, 0, 0, w * period, 0
    end
    local sw, sprev, scurr, exp, sp
    if algo == FIXED_WINDOW then
      sw, sp, scurr, exp = sunpack('<dddd', v)
      sprev = 0
    elseif #v >= 40 then
      sw, sprev, scurr, exp, sp = sunpack('<ddddd', v)
    else
      sw, sprev, scurr, exp = sunpack('<dddd', v)
      sp = 0
    end
    if sp == 0 then
      sp = period
      if (sw + 1) * period > exp * 1000 then sw = w end
    end
    if sp ~= period and scurr + sprev > 0 then
      -- spec.carry
      local longer = period
      if sp > longer then longer = sp end
      local s = sw * sp + longer
      local nw = (s - s % period) / period - 1
      s = s - sp
      local pw = (s - s % period) / period - 1
      if pw == nw then
        sw, sprev, scurr = nw, 0, sprev + scurr
      elseif pw == nw - 1 then
        sw = nw
      else
        sw, sprev = nw, 0
      end
    end
    if sw > w and scurr + sprev > 0 then
      w = sw
    end
    local prev, curr = 0, 0
    if sw == w then
      prev, curr = sprev, scurr
    elseif sw == w - 1 then
      prev = scurr
    end
    return w, prev, curr, w * period, exp
  end

  -- window_reset: see spec.windowReset.
  local function window_reset(algo, prev, curr, start, period)
    if algo == FIXED_WINDOW then
      if curr > 0 then return start + period - now end
      return 0
    end
    if curr > 0 then return start + 2 * period - now end
    if prev > 0 then return start + period - now end
    return 0
  end

  local function member(cost, id)
    return string.format('%d', cost) .. ':' .. id
  end

  -- A sliding log or concurrency key is a sorted set of marks, members
  -- "cost:id" scored by ts (> 0), plus the member "" whose score is minus the
  -- sum of the marks' costs, so that a debit reads the sum instead of parsing
  -- every mark: it costs the marks that have expired (trimmed as it writes),
  -- not those that count.

  -- mark_cost returns the cost of mark member m.
  local function mark_cost(m)
    return tonumber(string.match(m, '^(%d+):'))
  end

  -- marks_sum returns the sum of the costs of the marks of key, and
  -- whether it counts marks with ts <= lo, that stopped counting: it drops
  -- the oldest of those, as many as the request may still drop (L.trims,
  -- MAX_TRIM a request), recording the sum of those left (or deleting the
  -- key when none is). Each expired mark is read once, not again by every
  -- call after, denials and peeks included, which write nothing else (a
  -- tenant denied again and again while its log's old marks expire made
  -- each denial read them all: 10 ms of Redis a denial at 20,000;
  -- TestMarksAtkLongLogDenial). A request drops no more: Redis runs one
  -- script at a time for every tenant, and a log of 300,000 marks that
  -- had all expired held it about a second in one call, past every other
  -- tenant's CallTimeout (TestMarksAtkExpiredLogTrimIsBounded). The marks
  -- left over still count, until later calls drop them: the sum is then
  -- more than what counts (behind), never less.
  local function marks_sum(key, lo)
    local all = redis.call('ZSCORE', key, '')
    if not all then
      return 0, false
    end
    local sum, left = -tonumber(all), L.trims
    local old = redis.call('ZRANGEBYSCORE', key, '(0', lo, 'LIMIT', 0, left + 1)
    local behind = #old > left
    if behind then
      old[#old] = nil
    end
    if #old == 0 then
      return sum, behind
    end
    for i = 1, #old do
      sum = sum - mark_cost(old[i])
    end
    L.trims = left - #old
    if behind then
      redis.call('ZREM', key, unpack(old))
    else
      redis.call('ZREMRANGEBYSCORE', key, '(0', lo)
    end
    if sum > 0 then
      redis.call('ZADD', key, -sum, '')
    else
      redis.call('DEL', key)
    end
    return sum, behind
  end

  -- marks_ttl sets the TTL of a sliding log or concurrency key to when its
  -- last mark stops counting, or deletes the key when it holds no marks.
  local function marks_ttl(algo, period, key)
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    if #last == 0 or last[1] == '' then
      redis.call('DEL', key)
      return
    end
    local lag = 0
    if algo == SLIDING_LOG then lag = period end
    redis.call('PEXPIRE', key, ceil_div(tonumber(last[2]) + lag - now, 1000) + ttl_pad)
  end

  -- marks evaluates cost on a sliding log or concurrency key (see
  -- spec.evaluateMarks) and returns allowed, remaining, retry and reset,
  -- then what a debit writes with: the sum of the marks that count and the
  -- newest mark's ts, both before the debit.
  local function marks(algo, cap, period, key, cost, after)
    -- A sliding log counts marks with ts > now - period and adds one at now;
    -- a concurrency limit counts marks with ts > now (live leases) and adds
    -- one expiring at now + period.
    local lo, lag, hi = now, 0, now + period
    if algo == SLIDING_LOG then
      lo, lag, hi = now - period, period, now
    end
    local sum, behind = marks_sum(key, lo)
    local sum0, newest = sum, 0
    if sum > 0 then
      newest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
    end
    local ok, retry = 0, 0
    if sum + cost <= cap then
      ok = 1
      if after and cost > 0 then
        sum = sum + cost
        if hi > newest then newest = hi end
      end
    elseif behind then
      -- The sum counts marks that stopped counting, which the next calls
      -- drop: the request may come again at once.
      retry = 1
    else
      -- Wait for the oldest marks to stop counting: until those whose
      -- costs add up to need do, among the oldest MAX_RETRY_WALK; past
      -- them, until the last of those does (sooner than the exact answer,
      -- which the request is told again then). A denial reads a bounded
      -- part of the log: Redis runs one script at a time, for every
      -- tenant (see spec.evaluateMarks).
      local need, acc = sum + cost - cap, 0
      local ms = redis.call('ZRANGEBYSCORE', key, '(' .. string.format('%d', lo), '+inf', 'WITHSCORES', 'LIMIT', 0, MAX_RETRY_WALK)
      for i = 1, #ms, 2 do
        acc = acc + mark_cost(ms[i])
        if acc >= need or i + 1 == 2 * MAX_RETRY_WALK then
          retry = tonumber(ms[i + 1]) + lag - now
          break
        end
      end
      if retry == 0 then
        error(redis.error_reply('weighted: marks of ' .. key .. ' do not add up to their recorded sum'))
      end
    end
    local reset = 0
    if sum > 0 then
      reset = newest + lag - now
      if reset < 1 then reset = 1 end -- behind, every mark left expired
    end
    return ok, cap - sum, retry, reset, sum0, newest
  end

  -- adjust charges or refunds actual - reserved on key, an item of
  -- reservation id debited at debited µs (-1: unknown), as Settle does
  -- (see settle.lua and spec.settle).
  local function adjust(key, algo, cap, rate, period, tick, reserved, actual, id, debited)
    local p = period / tick
    local delta = actual - reserved
    local most = cap
    if algo <= GCRA then most = 2 * cap end -- a meter may owe one capacity beyond empty
    if delta > most then delta = most elseif delta < -most then delta = -most end
    if C and (algo == SLIDING_LOG or algo == 5) then
      flush()
    end
    if algo == 5 then
      if redis.call('ZREM', key, member(reserved, id)) == 1 then
        local all = -tonumber(redis.call('ZSCORE', key, '')) - reserved
        if all > 0 then
          redis.call('ZADD', key, -all, '')
        else
          redis.call('DEL', key)
        end
      end
    elseif delta ~= 0 and algo == SLIDING_LOG then
      local lo = now - period
      local sum, behind = marks_sum(key, lo)
      local m = member(reserved, id)
      local score = redis.call('ZSCORE', key, m)
      if score and tonumber(score) <= lo then
        -- Stopped counting, not dropped yet (behind): as if it were.
        redis.call('ZREM', key, m)
        sum, score = sum - reserved, nil
      end
      -- Behind, the sum holds marks that stopped counting: the charge is
      -- not bounded by it, so that none is lost once they are dropped.
      if score then
        local c = reserved + delta
        if c < 0 then c = 0 end
        if not behind and c > reserved + cap - sum then c = reserved + cap - sum end
        redis.call('ZREM', key, m)
        if c > 0 then redis.call('ZADD', key, score, member(c, id)) end
        sum = sum - reserved + c
      else
        local c = delta
        if not behind and c > cap - sum then c = cap - sum end
        if c > 0 then
          redis.call('ZADD', key, now, member(c, id))
          sum = sum + c
        end
      end
      if sum > 0 then
        redis.call('ZADD', key, -sum, '')
      else
        redis.call('ZREM', key, '')
      end
      marks_ttl(algo, period, key)
    elseif delta ~= 0 then
      local v = get(key)
      if v or delta > 0 then
        if algo <= 1 then
          local ts, d, exp = meter(v, cap, rate, tick, p)
          d = d + delta * p
          if d < 0 then d = 0 elseif d > 2 * cap * p then d = 2 * cap * p end
          local reset = 0
          if d > 0 then reset = ts + ceil_div(d, rate) * tick - now end
          write(key, store(ts, d, p, reset, exp, period))
        elseif algo == 6 then
          -- As a fixed window: a refund only into the month debited.
          local w, _, curr, _, exp, stop, _, rw = window(v, period, algo, debited >= 0 and debited)
          if delta > 0 then
            curr = curr + delta
            if curr > cap then curr = cap end
          elseif rw == w then
            curr = curr + delta
            if curr < 0 then curr = 0 end
          end
          local reset = 0
          if curr > 0 then reset = stop - now end
          write(key, store(w, -1, curr, reset, exp, period))
        else
          local w, prev, curr, start, exp = window(v, period, algo)
          if algo == FIXED_WINDOW then prev = 0 end
          local rw = -2
          if debited >= 0 then rw = floor(debited / period) end
          if delta > 0 and algo == SLIDING_WINDOW then
            -- Up to full: the weighted count stays at most the capacity.
            local e = now - start
            if e < 0 then e = 0 end
            e = floor(e / tick)
            local room = cap * p - (curr * p + prev * (p - e))
            if room < 0 then room = 0 end
            room = floor(room / p)
            if delta < room then curr = curr + delta else curr = curr + room end
          elseif delta > 0 then
            curr = curr + delta
            if curr > cap then curr = cap end
          elseif rw == w then
            curr = curr + delta
            if curr < 0 then curr = 0 end
          elseif rw == w - 1 and algo == SLIDING_WINDOW then
            prev = prev + delta
            if prev < 0 then prev = 0 end
          end
          local reset = window_reset(algo, prev, curr, start, period)
          if algo == FIXED_WINDOW then
            write(key, store(w, period, curr, reset, exp, period))
          else
            write(key, store(w, prev, curr, reset, exp, period, true))
          end
        end
      end
    end
  end

  -- A leased item's key K has a lease index, KEYS in its request after
  -- the generation markers: a hash of the leases taken on K (see
  -- Redis.Lease), field the lease's id, value four doubles: count, the
  -- units the key counts for the lease; reported, the units its replica
  -- has reported spent; expires, when the store gives back count -
  -- reported (µs), or, once it has, minus when the record goes; and
  -- debited, when the lease was taken (µs).

  -- lease_reports applies the reports of a Lease call to the leases of
  -- index idx on key (its spec algo to tick): reps holds per report the
  -- lease's id, the units spent and 1 when the lease is done. A lease
  -- still open records what was spent; one done is settled (actual = what
  -- was spent) and dropped. A lease the store gave back already is
  -- charged what was spent beyond what it kept counted, then dropped when
  -- done. A lease the index does not hold is ignored.
  local function lease_reports(key, idx, algo, cap, rate, period, tick, reps)
    for j = 1, #reps, 3 do
      local rid, used, done = reps[j], reps[j + 1], reps[j + 2]
      local v = redis.call('HGET', idx, rid)
      if v then
        local count, reported, exp, deb = sunpack('<dddd', v)
        if used > count and exp > 0 then used = count end
        if used < reported then used = reported end
        if exp < 0 and used > count then
          adjust(key, algo, cap, rate, period, tick, count, used, rid, deb)
          count = used
        end
        if done == 1 then
          if exp > 0 then
            adjust(key, algo, cap, rate, period, tick, count, used, rid, deb)
          end
          redis.call('HDEL', idx, rid)
        elseif used ~= reported then
          redis.call('HSET', idx, rid, pack('<dddd', count, used, exp, deb))
        end
      end
    end
  end

  -- lease_expire gives back, for every lease of index idx past its
  -- expiry, what its replica has not reported spent, and drops the
  -- records given back a TTL ago.
  local function lease_expire(key, idx, algo, cap, rate, period, tick)
    local recs = redis.call('HGETALL', idx)
    for j = 1, #recs, 2 do
      local count, reported, exp, deb = sunpack('<dddd', recs[j + 1])
      if exp > 0 and exp <= now then
        adjust(key, algo, cap, rate, period, tick, count, reported, recs[j], deb)
        redis.call('HSET', idx, recs[j], pack('<dddd', reported, reported, -(now + exp - deb), deb))
      elseif exp < 0 and -exp <= now then
        redis.call('HDEL', idx, recs[j])
      end
    end
  end

  L = {
    store = store, batch = batch, flush = flush, write = write, checked = checked, mget = mget, get = get,
    meter = meter, window = window, window_reset = window_reset, member = member,
    mark_cost = mark_cost, marks_sum = marks_sum, marks_ttl = marks_ttl,
    marks = marks, adjust = adjust, lease_reports = lease_reports, lease_expire = lease_expire,
    trims = MAX_TRIM,
  }
  return L
end
