-- settle.lua: Settle and Cancel of reservation id, request r of a batch,
-- over n items. batch.lua runs it inside its loop over requests, as a block
-- that may break. Its keys are KEYS[k + 1] to KEYS[k + n], the items' keys
-- (meters and windows first), then the reservation's record key
-- KEYS[k + n + 1]. Its items are in buf from pos on: per item, doubles
-- algo, cap, rate, period, tick, reserved cost, actual cost. remember is
-- how long to remember the id (ms); 0 deletes its record instead. In a
-- batch (C set), it reads and writes meters and windows through lib's
-- cache (see C there).
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
  L.adjust(key, algo, cap, rate, period, tick, reserved, actual, id, debited)
end
if remember > 0 then
  redis.call('SET', rkey, 'd', 'PX', remember)
else
  -- A compensation (remember 0): the id is forgotten, as if never
  -- debited here (see Redis.DebitInto).
  redis.call('DEL', rkey)
end
replies[r] = 1
