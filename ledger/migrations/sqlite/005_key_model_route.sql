-- The model and the route the limiter keyed an entry's request by, when
-- they are not its model and route (a downgrade served another model, a
-- model asked for by an alias, a reserve API request named by its
-- caller): a limiter that lost its counters restores those of its limits
-- keyed by model or route from them. Entries written before them read as
-- keyed by their model and route.
ALTER TABLE ledger_entries ADD COLUMN key_model TEXT NOT NULL DEFAULT '';
ALTER TABLE ledger_entries ADD COLUMN key_route TEXT NOT NULL DEFAULT '';
