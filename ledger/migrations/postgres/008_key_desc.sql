-- What a front door's own limits (the rate limit service's descriptor
-- limits) counted of an entry, one line per counter (see Entry.KeyDesc):
-- a limiter that lost its counters restores those limits from it. Empty
-- for entries written before it: such an entry counts on no descriptor
-- counter, whose restore misses it (at most one window of them, from the
-- entries written before the upgrade).
ALTER TABLE ledger_entries ADD COLUMN key_desc TEXT NOT NULL DEFAULT '';
