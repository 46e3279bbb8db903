-- restore.lua: Restore (op 4), request r of a batch, over n items. batch.lua
-- runs it inside its loop over requests, as a block. Its keys are KEYS[k +
-- 1] to KEYS[k + n], the items' keys (meters and windows first), then the
-- ng generation markers (see batch.lua). Its items are in buf from pos on:
-- per item, doubles algo, cap, rate, period, tick, 0 and counted. Each
-- item's used amount (its capacity minus what Peek reports remaining; a
-- meter's debt, which counts what it owes beyond empty too) is raised to
-- counted, as Settle charges an extra cost: a meter's debt
-- grows, up to one capacity owed beyond empty (two capacities used, as a
-- settlement may leave it); a window's current count grows, up to its
-- capacity (a sliding window's only up to full); a sliding log gets one mark at now of what its
-- marks that count lack of counted (see spec.restoreLog: member
-- "<cost>:restore-<now>", ".2", ".3" ... appended while that member is
-- there). Concurrency limits take counted 0 (Redis.Restore checks it) and
-- are left alone. Then every
-- marker is set to a fresh generation, the largest of now (µs), one more
-- than it held and one more than the client has seen, so that a marker
-- restored never reads as behind. Its reply, replies[r], is a string of
-- the markers' new values.
-- A staged restore (see Redis.RestoreStage) has remember, its mode: 1
-- for its first call, 2 for a later one, 3 for its last (0: a plain
-- restore), and id "expected|new"; its note keys, one per tag, come after
-- the items' keys, before the markers. A call after the first finds the
-- note the call before it left, or writes nothing and replies -1: the
-- store lost its data since (a FLUSHALL, a restart, a failover), and with
-- it the counters the calls before raised.
local nt, expected, note = nkeys - n - ng, false, false
if remember > 0 then
  expected, note = string.match(id, '^(.*)|(.*)$')
end
local lost = false
if remember >= 2 then
  for j = 1, nt do
    if redis.call('GET', KEYS[k + n + j]) ~= expected then lost = true end
  end
end
if lost then
  replies[r] = pack('<d', -1)
  break
end
local L = lib()
for i = 1, n do
  local key = KEYS[k + i]
  local algo, cap, rate, period, tick, _, counted
  algo, cap, rate, period, tick, _, counted, pos = sunpack('<ddddddd', buf, pos)
  local p = period / tick
  if counted > 0 and algo <= GCRA then
    local ts, d, exp = L.meter(L.get(key), cap, rate, tick, p)
    local full = cap * p
    local delta = counted - ceil_div(d, p) -- what it holds, owed beyond empty too
    if delta > 0 then
      d = d + delta * p
      if d > 2 * full then d = 2 * full end
      L.write(key, L.store(ts, d, p, ts + ceil_div(d, rate) * tick - now, exp, period))
    end
  elseif counted > 0 and algo == MONTH_WINDOW then
    local w, _, curr, _, exp, stop = L.window(L.get(key), period, algo)
    if counted > curr then
      curr = counted
      if curr > cap then curr = cap end
      L.write(key, L.store(w, -1, curr, stop - now, exp, period))
    end
  elseif counted > 0 and algo == FIXED_WINDOW then
    local w, _, curr, start, exp = L.window(L.get(key), period, algo)
    if counted > curr then
      curr = counted
      if curr > cap then curr = cap end
      L.write(key, L.store(w, period, curr, L.window_reset(algo, 0, curr, start, period), exp, period))
    end
  elseif counted > 0 and algo == SLIDING_LOG then
    -- A sorted set, not cached: the pending writes go first, as adjust
    -- does, so that a key of the wrong type fails after them.
    if C then
      L.flush()
    end
    local sum, behind = L.marks_sum(key, now - period)
    if counted > cap then counted = cap end
    local delta = counted - sum
    if behind then
      -- The sum holds marks that stopped counting: the whole count is
      -- written, which may refuse early, never late.
      delta = counted
    end
    if delta > 0 then
      local base = 'restore-' .. string.format('%d', now)
      local id, m, c = base, L.member(delta, base), 2
      while redis.call('ZSCORE', key, m) do
        id = base .. '.' .. string.format('%d', c)
        m, c = L.member(delta, id), c + 1
      end
      redis.call('ZADD', key, now, m)
      redis.call('ZADD', key, -(sum + delta), '')
      L.marks_ttl(algo, period, key)
    end
  elseif counted > 0 and algo == SLIDING_WINDOW then
    local w, prev, curr, start, exp = L.window(L.get(key), period, algo)
    local e = now - start
    if e < 0 then e = 0 end
    e = floor(e / tick)
    local room = cap * p - (curr * p + prev * (p - e))
    if room < 0 then room = 0 end
    room = floor(room / p)
    local delta = counted - cap + room
    if delta > 0 then
      if delta > cap then delta = cap end
      if delta < room then curr = curr + delta else curr = curr + room end
      L.write(key, L.store(w, prev, curr, L.window_reset(algo, prev, curr, start, period), exp, period, true))
    end
  end
end
if C then
  L.flush()
end
if remember == 1 or remember == 2 then
  for j = 1, nt do
    redis.call('SET', KEYS[k + n + j], note, 'PX', 3600000)
  end
elseif remember == 3 then
  for j = 1, nt do
    redis.call('DEL', KEYS[k + n + j])
  end
end
local gens = {}
for j = 1, ng do
  local mk = KEYS[k + nkeys - ng + j]
  local g = tonumber(redis.call('GET', mk) or '0')
  local v = now
  if g + 1 > v then v = g + 1 end
  if seen[j] + 1 > v then v = seen[j] + 1 end
  redis.call('SET', mk, string.format('%d', v))
  gens[j] = v
end
replies[r] = pack('<' .. string.rep('d', ng + 1), 1, unpack(gens, 1, ng))
