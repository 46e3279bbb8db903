-- batch.lua: the script's body, appended to lib.lua, with settle.lua,
-- debit.lua and renew.lua spliced in where named. It runs a batch of
-- requests in their order, each seeing the writes of those before it, and
-- replies with a table of one reply per request: debit's string, settle's
-- 1 or 0 (a claimed settle's, or the claim found), or renew's count. A batch of one request replies as that
-- request, without the table. A batch of more reads each meter and window key once and writes it once,
-- at the end, with the value and TTL the requests one by one would have
-- left (see C in lib). An error (a key of the wrong type, a value too
-- short to read) ends its request alone: in a batch of more than one, its
-- reply is the error, and the requests after it run, so that one tenant's
-- spoiled key fails no other tenant's call (a lone request's error is the
-- script's). The requests before it keep their writes.
-- ARGV[1]: the requests, one after another, each a header of doubles n
-- (items), its number of keys, time override (0: TIME), op (0 peek, 1
-- debit, 2 settle, 3 renew, 4 restore, 5 lease, 6 claimed settle, 7 final
-- debit), the number of meters
-- and windows, how long to remember a settled id (ms), ng, nl, then ng
-- doubles, then nl doubles (and for a lease its TTL in µs, the number of
-- its reports and three doubles per report: the lease's sequence number,
-- its units spent, 1 if done), then its items as debit, settle, renew or
-- restore reads them (a lease as debit). ng is the number of generation
-- markers, the request's keys before the nl lease indexes, which come
-- last (0 when generations are off, and for settle and renew), and the
-- doubles are the highest value of each that the client has seen
-- (seen[j], 0 for none). A lease's id ends in its sequence number; the
-- leases its reports name are its id's prefix and their numbers.
-- ARGV[r + 1]: request r's reservation id. KEYS: every request's keys, in
-- the order of the requests.
-- The time is read once per batch (TIME), or set by each request's
-- override. The requests run inline, not as functions, which would cost
-- a closure each per call.
local buf, m = ARGV[1], #ARGV - 1
local replies, at, k = {}, 1, 0
-- C: in a batch of more than one request, the values of its meters and
-- windows (see lib's batch), else false.
local C = false
if m > 1 then
  C = lib().batch()
end
-- cur is the request that runs, and nk its number of keys once it has
-- been read (0 before): a request that fails is skipped by them.
local cur, nk = 0, 0
-- run runs the requests from the from-th on. It is one function per
-- script call, so that a batch can catch a request's error (pcall).
local function run(from)
for r = from, m do
  cur, nk = r, 0
  local n, nkeys, override, op, ns, remember, ng, nl, pos = sunpack('<dddddddd', buf, at)
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
end
end
if m == 1 then
  run(1)
  return replies[1]
end
local from = 1
while true do
  local ok, e = pcall(run, from)
  if ok then
    break
  end
  if nk == 0 then
    error(e) -- a request the script cannot read: the client's bug
  end
  -- A redis.call's error is a table; Lua's own a string. Its reply starts
  -- with ERR, so that the client reads it as an error of its own.
  if type(e) == 'table' then
    e = e.err
  end
  replies[cur] = redis.error_reply('ERR weighted: request failed: ' .. tostring(e))
  k, from = k + nk, cur + 1
end
lib().flush()
return replies
