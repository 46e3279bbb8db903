-- batch.lua: the script's body, appended to lib.lua, with request.lua
-- (and in it settle.lua, debit.lua, renew.lua and restore.lua) spliced in
-- where named. It runs a batch of
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
-- override. A lone request runs inline, not in a function, which would
-- cost a closure and its upvalues per call; the requests of a batch of
-- more run in one function, under pcall.
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
-- A lone request runs inline: its error is the script's.
if m == 1 then
  for r = 1, 1 do
-- request.lua
  end
  return replies[1]
end
-- run runs the requests from the from-th on: one function per script
-- call, so that a batch can catch a request's error (pcall).
local function run(from)
  for r = from, m do
    cur, nk = r, 0
-- request.lua
  end
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
