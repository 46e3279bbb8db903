-- renew.lua: Renew of reservation id, request r of a batch, over n items,
-- all concurrency limits of a positive cost (Redis.Renew sends no other).
-- batch.lua runs it inside its loop over requests, as a block. Its keys
-- are KEYS[k + 1] to KEYS[k + n], the items' keys, then the reservation's
-- record keys, KEYS[k + n + 1] to KEYS[k + nkeys] (see Redis.renewKeys):
-- id has ended (settled or cancelled) when one of them holds 'd'. Its
-- items are in buf from pos on, as debit.lua reads them: per item, doubles
-- algo, cap, rate, period, tick, reserved cost. Each mark "cost:id" whose
-- lease is unexpired (score > now) and ends before now + period moves to
-- now + period; the marks' sum (the member "") is unchanged. A mark gone
-- (trimmed, or lost with Redis's data) or expired is held again, when id
-- has not ended: added at now + period and its cost to the sum, past the
-- capacity if need be (its holder, which renews, still runs), as a debit
-- adds it. A mark of an id ended stays gone: a renewal never resurrects a
-- reservation. Either way the key lives at least until now + period.
-- Its reply, replies[r], is the number of leases moved or held again.
if C then
  -- A sorted set command may fail (a key of the wrong type): the writes
  -- of the requests before go first (see lib's C).
  lib().flush()
end
local ended = false
for j = k + n + 1, k + nkeys do
  if redis.call('GET', KEYS[j]) == 'd' then
    ended = true
    break
  end
end
local moved = 0
for i = 1, n do
  local _, period, cost
  _, _, _, period, _, cost, pos = sunpack('<dddddd', buf, pos)
  local key, mb = KEYS[k + i], string.format('%d', cost) .. ':' .. id
  local at = redis.call('ZSCORE', key, mb)
  at = at and tonumber(at)
  local hi = now + period
  local write = false
  if at and at > now then
    if at < hi then
      redis.call('ZADD', key, 'XX', hi, mb)
      write = true
    end
  elseif not ended then
    -- Trims the expired marks, this one's too, from the sum first.
    local sum = lib().marks_sum(key, now)
    if at and redis.call('ZSCORE', key, mb) then
      sum = sum - cost -- expired, not dropped yet (marks_sum behind): it moves
    end
    redis.call('ZADD', key, -(sum + cost), '')
    redis.call('ZADD', key, hi, mb)
    write = true
  end
  if write then
    local px = ceil_div(period, 1000) + ttl_pad
    if redis.call('PTTL', key) < px then
      redis.call('PEXPIRE', key, px)
    end
    moved = moved + 1
  end
end
replies[r] = moved
