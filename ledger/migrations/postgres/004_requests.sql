-- The requests the limiter counted an entry for on its limits in
-- requests: 1 for a proxied request, an RLS debit's hits, the reserve
-- API's requests, 0 for a charge of usage already served. Entries written
-- before it counted 1 each.
ALTER TABLE ledger_entries ADD COLUMN requests bigint NOT NULL DEFAULT 1;
