-- settle.lua: Settle and Cancel of reservation id, request r of a batch,
-- over n items. batch.lua runs it inside its loop over requests, as a block
-- that may break. Its keys are KEYS[k + 1] to KEYS[k + n], the items' keys
-- (meters and windows first), then the reservation's record key
-- KEYS[k + n + 1]. Its items are in buf from pos on: per item, doubles
-- algo, cap, rate, period, tick, reserved cost, actual cost. remember is
-- how long to remember the id (ms). In a batch (C set), it reads and
-- writes meters and windows through lib's cache (see C there).
-- Its reply, replies[r], is 1, or 0 when the id was settled already.
local L = lib()
local rkey = KEYS[k + n + 1]
-- Read with pcall, so that a batch's writes are made before it fails on
-- a record it cannot read.
local rec = redis.pcall('GET', rkey)
if type(rec) == 'table' or rec and rec ~= 'd' and #rec < 8 then
  L.checked(rec, 8)
end
if rec == 'd' then
  replies[r] = 0
  break
end
local debited = -1
if rec then
  debited = sunpack('<d', rec)
end

for i = 1, n do
  local key = KEYS[k + i]
  local algo, cap, rate, period, tick, reserved, actual
  algo, cap, rate, period, tick, reserved, actual, pos = sunpack('<ddddddd', buf, pos)
  local p = period / tick
  local delta = actual - reserved
  if delta > cap then delta = cap elseif delta < -cap then delta = -cap end
  if C and (algo == SLIDING_LOG or algo == CONCURRENCY) then
    L.flush()
  end
  if algo == CONCURRENCY then
    if redis.call('ZREM', key, L.member(reserved, id)) == 1 then
      local all = -tonumber(redis.call('ZSCORE', key, '')) - reserved
      if all > 0 then
        redis.call('ZADD', key, -all, '')
      else
        redis.call('DEL', key)
      end
    end
  elseif delta ~= 0 and algo == SLIDING_LOG then
    local lo = now - period
    local sum, gone = L.marks_sum(key, lo)
    if gone > 0 then
      redis.call('ZREMRANGEBYSCORE', key, '(0', lo)
    end
    local m = L.member(reserved, id)
    local score = redis.call('ZSCORE', key, m)
    if score then
      local c = reserved + delta
      if c < 0 then c = 0 end
      if c > reserved + cap - sum then c = reserved + cap - sum end
      redis.call('ZREM', key, m)
      if c > 0 then redis.call('ZADD', key, score, L.member(c, id)) end
      sum = sum - reserved + c
    else
      local c = delta
      if c > cap - sum then c = cap - sum end
      if c > 0 then
        redis.call('ZADD', key, now, L.member(c, id))
        sum = sum + c
      end
    end
    if sum > 0 then
      redis.call('ZADD', key, -sum, '')
    else
      redis.call('ZREM', key, '')
    end
    L.marks_ttl(algo, period, key)
  elseif delta ~= 0 then
    local v = L.get(key)
    if v or delta > 0 then
      if algo <= GCRA then
        local ts, d, exp = L.meter(v, cap, rate, tick, p)
        d = d + delta * p
        if d < 0 then d = 0 elseif d > cap * p then d = cap * p end
        local reset = 0
        if d > 0 then reset = ts + ceil_div(d, rate) * tick - now end
        L.write(key, L.store(ts, d, p, reset, exp, period))
      elseif algo == MONTH_WINDOW then
        -- As a fixed window: a refund only into the month debited.
        local w, _, curr, _, exp, stop, _, rw = L.window(v, period, algo, debited >= 0 and debited)
        if delta > 0 then
          curr = curr + delta
          if curr > cap then curr = cap end
        elseif rw == w then
          curr = curr + delta
          if curr < 0 then curr = 0 end
        end
        local reset = 0
        if curr > 0 then reset = stop - now end
        L.write(key, L.store(w, -1, curr, reset, exp, period))
      else
        local w, prev, curr, start, exp = L.window(v, period, algo)
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
        local reset = L.window_reset(algo, prev, curr, start, period)
        if algo == FIXED_WINDOW then
          L.write(key, L.store(w, period, curr, reset, exp, period))
        else
          L.write(key, L.store(w, prev, curr, reset, exp, period, true))
        end
      end
    end
  end
end
redis.call('SET', rkey, 'd', 'PX', remember)
replies[r] = 1
