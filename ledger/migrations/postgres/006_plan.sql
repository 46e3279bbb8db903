-- The plan of the caller the limiter decided an entry's request for, the
-- plan its limits were chosen by: a limiter that lost its counters
-- restores those of its deployment-wide limits of some plans from the
-- entries of those plans only. Empty for entries written before it (and
-- for a caller without a plan): such an entry counts on every limit of
-- some plans, which may refuse early, never late.
ALTER TABLE ledger_entries ADD COLUMN plan TEXT NOT NULL DEFAULT '';
