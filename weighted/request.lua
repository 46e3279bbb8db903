-- request.lua: one request of a batch, r, the body of batch.lua's loop
-- over requests, spliced there twice: inline for a lone request, and in
-- the function that a batch of more runs under pcall. debit.lua,
-- settle.lua, renew.lua and restore.lua are spliced in where named.
local n, nkeys, override, op, ns, remember, ng, nl, pos = sunpack('<dddddddd', buf, at)
if L then
  L.trims = MAX_TRIM -- the marks it may drop (see lib's marks_sum)
end
local seen = false
if ng > 0 then
  seen = {}
  for j = 1, ng do
    seen[j], pos = sunpack('<d', buf, pos)
  end
end
-- Lease indexes (see lib's lease_reports): li[j] is the item, 1 to n,
-- whose index is the request's key nkeys - nl + j; a Lease (op 5) has
-- one, and its TTL (µs) and reports follow.
local li, lttl, reps = false, 0, false
if nl > 0 then
  li = {}
  for j = 1, nl do
    li[j], pos = sunpack('<d', buf, pos)
  end
  if op == 5 then
    local nrep
    lttl, nrep, pos = sunpack('<dd', buf, pos)
    reps = {}
    local base = string.match(ARGV[r + 1], '^(.-)%d+$')
    for j = 1, 3 * nrep, 3 do
      local seq
      seq, reps[j + 1], reps[j + 2], pos = sunpack('<ddd', buf, pos)
      reps[j] = base .. string.format('%d', seq)
    end
  end
end
if r == 1 or override > 0 then
  set_now(override)
end
local id, mode = ARGV[r + 1], op
if op == 5 or op == 7 then
  mode = 1
end
-- A claimed settle (op 6) is a settle whose claim, its TTL (ms), its
-- length and its text, comes before its items; its claim key follows
-- the record key.
local claim, cttl = false, 0
if op == 6 then
  local clen
  cttl, clen, pos = sunpack('<dd', buf, pos)
  claim = string.sub(buf, pos, pos + clen - 1)
  pos = pos + clen
  op = 2
end
if op == 2 or op == 4 then
  at = pos + 56 * n
else
  at = pos + 48 * n
end
nk = nkeys
repeat
  if op == 2 then
    if claim then
      -- The first end of a reservation claims it; a later one changes
      -- nothing and replies with that claim.
      local ckey = KEYS[k + n + 2]
      local prior = redis.call('GET', ckey)
      if prior then
        replies[r] = prior
        break
      end
      -- No claim: with generation markers (the items' tags', the last
      -- ng keys), one missing or behind says the store lost the tag's
      -- state, its claims with it, so no claim is no evidence: reply
      -- minus the mask of those markers (bit j - 1 for marker j) and
      -- change nothing (see Redis.SettleClaimed).
      local lost, bit = 0, 1
      for j = 1, ng do
        local g = tonumber(redis.call('GET', KEYS[k + nkeys - ng + j]) or '0')
        if g == 0 or g < seen[j] then lost = lost + bit end
        bit = bit * 2
      end
      if lost > 0 then
        replies[r] = -lost
        break
      end
      redis.call('SET', ckey, claim, 'PX', cttl)
    end
-- settle.lua
  elseif mode < 2 then
-- debit.lua
  elseif op == 3 then
-- renew.lua
  else
-- restore.lua
  end
until true
k = k + nkeys
