-- settle.lua: Settle and Cancel of reservation id over n items.
-- KEYS: the items' keys, then the reservation's record key. ARGV[1]: int64
-- n, time override (0: TIME), how long to remember the id (ms), then per item
-- algo, cap, rate, period, tick, reserved cost, actual cost. ARGV[2]: the id.
-- Returns 1, or 0 when the id was settled already.
local buf, id = ARGV[1], ARGV[2]
local n, override, remember, pos = struct.unpack('<i8i8i8', buf)
local now = now_us(override)
local items = read_items(buf, pos, n, true)
local rkey = KEYS[n + 1]
local rec = redis.call('GET', rkey)
if rec == 'd' then
  return 0
end
local debited = -1
if rec then
  debited = struct.unpack('<i8', rec)
end

for i = 1, n do
  local it, key = items[i], KEYS[i]
  local algo, cap, period, p, reserved, actual = it[1], it[2], it[4], it[6], it[7], it[8]
  local delta = actual - reserved
  if delta > cap then delta = cap elseif delta < -cap then delta = -cap end
  if algo == CONCURRENCY then
    redis.call('ZREM', key, member(reserved, id))
  elseif delta ~= 0 and algo == SLIDING_LOG then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - period)
    local sum = 0
    for _, m in ipairs(redis.call('ZRANGE', key, 0, -1)) do
      sum = sum + tonumber(string.match(m, '^(%d+):'))
    end
    local m = member(reserved, id)
    local score = redis.call('ZSCORE', key, m)
    if score then
      local c = reserved + delta
      if c < 0 then c = 0 end
      if c > reserved + cap - sum then c = reserved + cap - sum end
      redis.call('ZREM', key, m)
      if c > 0 then redis.call('ZADD', key, score, member(c, id)) end
    else
      local c = delta
      if c > cap - sum then c = cap - sum end
      if c > 0 then redis.call('ZADD', key, now, member(c, id)) end
    end
    marks_ttl(it, key, now)
  elseif delta ~= 0 then
    local v = redis.call('GET', key)
    if v or delta > 0 then
      if algo == TOKEN_BUCKET or algo == GCRA then
        local ts, d = meter_at(it, v, now)
        d = d + delta * p
        if d < 0 then d = 0 elseif d > cap * p then d = cap * p end
        set_value(key, pack3(ts, d, p), meter_reset(it, ts, d, now))
      else
        local w, prev, curr, start = window_at(it, v, now)
        if algo == FIXED_WINDOW then prev = 0 end
        local rw = -2
        if debited >= 0 then rw = math.floor(debited / period) end
        if delta > 0 and algo == SLIDING_WINDOW then
          -- Up to full: the weighted count stays at most the capacity.
          local e = now - start
          if e < 0 then e = 0 end
          e = math.floor(e / it[5])
          local room = cap * p - (curr * p + prev * (p - e))
          if room < 0 then room = 0 end
          room = math.floor(room / p)
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
        set_value(key, pack3(w, prev, curr), window_reset(it, prev, curr, start, now))
      end
    end
  end
end
redis.call('SET', rkey, 'd', 'PX', remember)
return 1
