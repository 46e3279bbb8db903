-- debit.lua: Debit (mode 1; op 7, a final one, keeps its reservation
-- record FINAL_RECORD_MS at most), Peek (mode 0) and Lease (op 5, mode 1,
-- one item) of request r of a batch, n items, all or nothing. batch.lua runs
-- it inside its loop over requests, as a block that may break. Its keys
-- are KEYS[k + 1] to KEYS[k + n]: the items' keys, meters and windows (ns
-- of them) first, then, when a window item is debited, the reservation's
-- record key KEYS[k + n + 1], then its ng generation markers, then the
-- lease indexes of its nl leased items (li, see batch.lua). Its items
-- are in buf from pos on: per item, doubles algo, cap, rate, period, tick,
-- cost. id is the reservation id. In a batch (C set), it reads and writes
-- meters and windows through lib's cache (see C there).
-- Its reply, replies[r], is a string of doubles: allowed, then per item
-- allowed, remaining, retry µs and reset µs, then the values of its ng
-- generation markers. (One string costs Redis less to reply than a table
-- of integers.) When a marker is missing (0) or below what the client has
-- seen, the request is stale: it reads and writes nothing else, and its
-- reply is -1 then the markers' values. An admitted debit that writes
-- advances each marker by one (INCR).
local after = mode == 1
local gens = false
if ng > 0 then
  gens = {}
  local stale = false
  for j = 1, ng do
    local g = tonumber(redis.call('GET', KEYS[k + nkeys - nl - ng + j]) or '0')
    gens[j] = g
    if g == 0 or g < seen[j] then stale = true end
  end
  if stale then
    replies[r] = pack('<' .. string.rep('d', ng + 1), -1, unpack(gens, 1, ng))
    break
  end
end
-- Leases first: the reports of a Lease (op 5), then every lease of the
-- leased items' keys past its expiry gives back what its replica did not
-- report spent (see lib's lease_reports and lease_expire).
local pos0 = pos
if nl > 0 then
  local L = lib()
  if C then L.flush() end
  for j = 1, nl do
    local i = li[j]
    local ia, ic, ir, ip, it = sunpack('<ddddd', buf, pos0 + 48 * (i - 1))
    local key, idx = KEYS[k + i], KEYS[k + nkeys - nl + j]
    if reps then L.lease_reports(key, idx, ia, ic, ir, ip, it, reps) end
    L.lease_expire(key, idx, ia, ic, ir, ip, it)
  end
end
local vals = {}
if ns > 0 then
  if not C then
    vals = redis.call('MGET', unpack(KEYS, k + 1, k + ns))
  else
    -- In a batch, a key that a request before read or wrote is in C.
    vals = {false, false, false, false}
    for i = 1, ns do
      local v = C[KEYS[k + i]]
      if v == nil then
        vals = lib().mget(k, ns)
        break
      elseif v ~= 0 then
        vals[i] = v
      end
    end
  end
end

-- Evaluate every item; remember what an admitted debit writes: wv and wp
-- for meters and windows (see store), wm for sliding logs and concurrency.
-- Tables made by a constructor are allocated at their size once; grown
-- entry by entry they are rehashed at every power of two, which costs more
-- than all the arithmetic here. Four items fit; more grow the tables.
local out = {1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
local wv, wp, wm, rec_ttl = {false, false, false, false}, {false, false, false, false}, {}, 0
-- A denied debit debits nothing: the loop then runs again without the
-- debits (after false), so that the items that fit report their state
-- before their cost, as the items of a Peek do.
local items_at, again = pos, false
while true do
  for i = 1, n do
    local algo, cap, rate, period, tick, cost
    algo, cap, rate, period, tick, cost, pos = sunpack('<dddddd', buf, pos)
    local ok, rem, retry, reset = 0, 0, 0, 0
    if algo <= GCRA then
      -- The meter, as lib.lua's meter and store compute it, spelled out
      -- because it is the hot path: function calls cost more than the
      -- arithmetic.
      local p = period / tick
      local full = cap * p
      local v, ts, d, exp = vals[i], now, 0, 0
      if v then
        local vp
        ts, d, vp, exp = sunpack('<dddd', v)
        if d == 0 then
          ts = now
        else
          if vp ~= p then
            local f = math.ceil(d * p / vp)
            if f >= 2 * full then d = 2 * full else d = f end
          end
          if d > 2 * full then d = 2 * full end
          if now > ts then
            local e = now - ts
            e = (e - e % tick) / tick
            if e > 0 then
              local q = d + rate - 1
              if e >= (q - q % rate) / rate then
                ts, d = now, 0
              else
                d = d - e * rate
                ts = ts + e * tick
              end
            end
          end
        end
      end
      local nd = d + cost * p
      if nd <= full then
        ok = 1
        if after then d = nd end
      else
        local q = d - (cap - cost) * p + rate - 1
        retry = ts + (q - q % rate) / rate * tick - now
      end
      rem = full - d
      if rem < 0 then rem = 0 end
      rem = (rem - rem % p) / p
      if d > 0 then
        local q = d + rate - 1
        reset = ts + (q - q % rate) / rate * tick - now
      end
      if ok == 1 and after and cost > 0 then
        local need = now + reset + 999
        need = (need - need % 1000) / 1000
        if need <= exp then
          wv[i], wp[i] = pack('<dddd', ts, nd, p, exp), 0
        else
          local slack = period / 1000
          if slack > 60000 then slack = 60000 elseif slack < 1 then slack = 1 end
          exp = need + slack - slack % 1
          wv[i], wp[i] = pack('<dddd', ts, nd, p, exp), exp - now_ms + ttl_pad
        end
      end
    elseif algo == FIXED_WINDOW then
      -- The fixed window, as window and store compute it, spelled out too
      -- for a window written with the same period; window reads the others.
      local w, curr, exp = (now - now % period) / period, 0, 0
      local v = vals[i]
      if v then
        local sw, sp, scurr
        sw, sp, scurr, exp = sunpack('<dddd', v)
        if sp == period then
          if sw > w and scurr > 0 then w = sw end
          if sw == w then curr = scurr end
        else
          local _
          w, _, curr, _, exp = lib().window(v, period, algo)
        end
      end
      local start = w * period
      local ncurr = curr + cost
      if ncurr <= cap then
        ok = 1
        if after then curr = ncurr end
      else
        retry = start + period - now
      end
      rem = cap - curr
      if curr > 0 then reset = start + period - now end
      if ok == 1 and after and cost > 0 then
        local need = start + period + 999
        need = (need - need % 1000) / 1000
        if need <= exp then
          wv[i], wp[i] = pack('<dddd', w, period, ncurr, exp), 0
        else
          local slack = period / 1000
          if slack > 60000 then slack = 60000 elseif slack < 1 then slack = 1 end
          exp = need + slack - slack % 1
          wv[i], wp[i] = pack('<dddd', w, period, ncurr, exp), exp - now_ms + ttl_pad
        end
        if start + period - now > rec_ttl then rec_ttl = start + period - now end
      end
    elseif algo == SLIDING_WINDOW then
      local L = lib()
      local w, prev, curr, start, exp = L.window(vals[i], period, algo)
      local ncurr = curr + cost
      local p = period / tick
      local e = now - start
      if e < 0 then e = 0 end
      e = floor(e / tick)
      local full = cap * p
      -- A count carried from a larger capacity (a reload that lowered the
      -- rate) can make a term pass 2^50 and round: used is then beyond
      -- full either way, as spec.slidingUsed's saturated value is.
      local used = curr * p + prev * (p - e)
      if ncurr <= cap and used + cost * p <= full then
        ok = 1
        if after then
          curr = ncurr
          used = used + cost * p
        end
      else
        local target
        if ncurr <= cap then
          target = start + (p - floor((cap - curr - cost) * p / prev)) * tick
        else
          target = start + period + (p - floor((cap - cost) * p / curr)) * tick
        end
        retry = target - now
      end
      rem = full - used
      if rem < 0 then rem = 0 end
      rem = floor(rem / p)
      reset = L.window_reset(algo, prev, curr, start, period)
      if ok == 1 and after and cost > 0 then
        wv[i], wp[i] = L.store(w, prev, ncurr, L.window_reset(algo, prev, ncurr, start, period), exp, period, true)
        if start + 2 * period - now > rec_ttl then rec_ttl = start + 2 * period - now end
      end
    elseif algo == MONTH_WINDOW then
      -- A fixed window on calendar months (see lib's window).
      local L = lib()
      local w, _, curr, _, exp, stop, nend = L.window(vals[i], period, algo)
      local ncurr = curr + cost
      if ncurr <= cap then
        ok = 1
        if after then curr = ncurr end
      else
        retry = stop - now
      end
      rem = cap - curr
      if curr > 0 then reset = stop - now end
      if ok == 1 and after and cost > 0 then
        wv[i], wp[i] = L.store(w, -1, ncurr, stop - now, exp, period)
        if nend - now > rec_ttl then rec_ttl = nend - now end
      end
    elseif not again or out[4 * i - 2] == 1 then
      local L = lib()
      if C then L.flush() end
      local sum, newest
      ok, rem, retry, reset, sum, newest = L.marks(algo, cap, period, KEYS[k + i], cost, after)
      if ok == 1 and after and cost > 0 then
        wm[i] = {algo, period, cost, sum, newest}
      end
    else
      -- A sliding log or concurrency limit that refused keeps its answer:
      -- read again, it would drop more of its expired marks when behind
      -- (see marks_sum), and might fit, though nothing is debited.
      local o = 4 * i - 2
      ok, rem, retry, reset = out[o], out[o + 1], out[o + 2], out[o + 3]
    end
    if ok == 0 then out[1] = 0 end
    local o = 4 * i - 2
    out[o], out[o + 1], out[o + 2], out[o + 3] = ok, rem, retry, reset
  end
  if out[1] == 1 or not after then break end
  after, again, pos = false, true, items_at
end
if out[1] == 0 or not after then
  local m = 4 * n + 1
  if gens then
    for j = 1, ng do out[m + j] = gens[j] end
    m = m + ng
  end
  replies[r] = pack('<' .. string.rep('d', m), unpack(out, 1, m))
  break
end

for i = 1, n do
  local px = wp[i]
  if px == 0 and not C then
    redis.call('SETRANGE', KEYS[k + i], '0', wv[i])
  elseif px then
    lib().write(KEYS[k + i], wv[i], px)
  elseif wm[i] then
    local L = lib()
    local key, algo, period, cost, sum, newest = KEYS[k + i], unpack(wm[i])
    local lo, hi, lag = now - period, now, period
    if algo == CONCURRENCY then
      lo, hi, lag = now, now + period, 0
    end
    local mb = L.member(cost, id)
    local at = redis.call('ZSCORE', key, mb)
    if at then
      -- A debit retried under the same id moves its mark (one that
      -- stopped counting is still in the sum while marks_sum is behind).
      sum = sum - cost
    end
    redis.call('ZADD', key, -(sum + cost), '')
    redis.call('ZADD', key, hi, mb)
    if hi > newest then newest = hi end
    redis.call('PEXPIRE', key, ceil_div(newest + lag - now, 1000) + ttl_pad)
  end
end
if rec_ttl > 0 then
  local px = ceil_div(rec_ttl, 1000)
  if op == 7 and px > FINAL_RECORD_MS then
    -- A final debit: its record serves only a compensation.
    px = FINAL_RECORD_MS
  end
  redis.call('SET', KEYS[k + n + 1], pack('<d', now), 'PX', px + ttl_pad)
end
if op == 5 then
  -- A lease taken: its record, until it is given back (a TTL) and a TTL
  -- more; the index lives a period more, so that no lease a replica dies
  -- holding is forgotten before its limit would have refilled it.
  local _, _, _, period, _, cost = sunpack('<dddddd', buf, pos0 + 48 * (li[1] - 1))
  if cost > 0 then
    local idx = KEYS[k + nkeys]
    redis.call('HSET', idx, id, pack('<dddd', cost, 0, now + lttl, now))
    local px = ceil_div(2 * lttl + period, 1000) + ttl_pad
    if redis.call('PTTL', idx) < px then
      redis.call('PEXPIRE', idx, px)
    end
  end
end
local m = 4 * n + 1
if gens then
  local wrote = false
  for i = 1, n do
    if wp[i] or wm[i] then wrote = true end
  end
  for j = 1, ng do
    if wrote then
      out[m + j] = redis.call('INCR', KEYS[k + nkeys - nl - ng + j])
    else
      out[m + j] = gens[j]
    end
  end
  m = m + ng
end
replies[r] = pack('<' .. string.rep('d', m), unpack(out, 1, m))
