-- renew.lua: Renew of reservation id, request r of a batch, over n items,
-- all concurrency limits of a positive cost (Redis.Renew sends no other).
-- batch.lua runs it inside its loop over requests, as a block. Its keys
-- are KEYS[k + 1] to KEYS[k + n], the items' keys. Its items are in buf
-- from pos on, as debit.lua reads them: per item, doubles algo, cap, rate,
-- period, tick, reserved cost. Each mark "cost:id" whose lease is
-- unexpired (score > now) and ends before now + period moves to
-- now + period, and its key lives at least until then. The marks' sum
-- (the member "") is unchanged: the mark keeps its cost and still counts.
-- A mark that is gone (settled, cancelled, trimmed) or expired stays so.
-- Its reply, replies[r], is the number of leases moved.
if C then
  -- A sorted set command may fail (a key of the wrong type): the writes
  -- of the requests before go first (see lib's C).
  lib().flush()
end
local moved = 0
for i = 1, n do
  local _, period, cost
  _, _, _, period, _, cost, pos = sunpack('<dddddd', buf, pos)
  local key, mb = KEYS[k + i], string.format('%d', cost) .. ':' .. id
  local at = redis.call('ZSCORE', key, mb)
  at = at and tonumber(at)
  local hi = now + period
  if at and at > now and at < hi then
    redis.call('ZADD', key, 'XX', hi, mb)
    local px = ceil_div(period, 1000) + ttl_pad
    if redis.call('PTTL', key) < px then
      redis.call('PEXPIRE', key, px)
    end
    moved = moved + 1
  end
end
replies[r] = moved
