-- A reservation of the reserve/settle API that expires unsettled is final
-- at its estimate with status 'expired'.
ALTER TABLE ledger_entries DROP CONSTRAINT IF EXISTS ledger_entries_status_check;
ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_status_check
    CHECK (status IN ('reserved', 'settled', 'recovered', 'failed', 'expired'));
