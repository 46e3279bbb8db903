-- What the limiter's keys held of an entry's client address and custom
-- attributes (see Entry.KeyIP, Entry.KeyAttrs): a limiter that lost its
-- counters restores those of its limits keyed by ip or by an attribute
-- from them. Empty for entries written before it: such an entry counts
-- on no counter of those limits, whose restore misses it (at most one
-- window of them, from the entries written before the upgrade).
ALTER TABLE ledger_entries ADD COLUMN key_ip TEXT NOT NULL DEFAULT '';
ALTER TABLE ledger_entries ADD COLUMN key_attrs TEXT NOT NULL DEFAULT '';
