-- The usage an entry's integer columns do not hold (1-hour cache writes,
-- audio tokens, web searches, file search calls, container gigabytes, the
-- service tier, inference geography and speed), estimated and actual: a
-- JSON object of the non-zero ones, '' for none.
ALTER TABLE ledger_entries ADD COLUMN est_extra TEXT NOT NULL DEFAULT '';
ALTER TABLE ledger_entries ADD COLUMN act_extra TEXT NOT NULL DEFAULT '';
