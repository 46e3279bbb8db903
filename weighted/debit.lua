-- debit.lua: Debit (mode 1) and Peek (mode 0) of n items, all or nothing.
-- KEYS: the items' keys, then (when a window item is debited) the
-- reservation's record key. ARGV[1]: int64 n, time override (0: TIME), mode,
-- then per item algo, cap, rate, period, tick, cost. ARGV[2]: reservation id.
-- Returns {allowed, then per item allowed, remaining, retry µs, reset µs}.
local buf, id = ARGV[1], ARGV[2]
local n, override, mode, pos = struct.unpack('<i8i8i8', buf)
local now = now_us(override)
local items = read_items(buf, pos, n, false)
local after = mode == 1

-- One MGET reads every meter and window key.
local skeys, sidx = {}, {}
for i = 1, n do
  if is_string_state(items[i][1]) then
    skeys[#skeys + 1] = KEYS[i]
    sidx[i] = #skeys
  end
end
local vals = {}
if #skeys > 0 then
  vals = redis.call('MGET', unpack(skeys))
end

local out, values, ttls = {1}, {}, {}
for i = 1, n do
  local it = items[i]
  local v = false
  if sidx[i] then v = vals[sidx[i]] end
  local ok, rem, retry, reset, value, ttl = evaluate(it, v, KEYS[i], now, it[7], after)
  if ok == 0 then out[1] = 0 end
  local o = 4 * i - 2
  out[o], out[o + 1], out[o + 2], out[o + 3] = ok, rem, retry, reset
  values[i], ttls[i] = value, ttl
end
if out[1] == 0 or not after then
  return out
end

local rec_ttl = 0
for i = 1, n do
  local it = items[i]
  if it[7] > 0 then
    if is_string_state(it[1]) then
      set_value(KEYS[i], values[i], ttls[i])
    else
      debit_marks(it, KEYS[i], now, it[7], id)
    end
    if it[1] == FIXED_WINDOW or it[1] == SLIDING_WINDOW then
      local t = record_ttl(it, now)
      if t > rec_ttl then rec_ttl = t end
    end
  end
end
if rec_ttl > 0 then
  redis.call('SET', KEYS[n + 1], struct.pack('<i8', now), 'PX', ttl_ms(rec_ttl))
end
return out
