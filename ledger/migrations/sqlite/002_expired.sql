-- A reservation of the reserve/settle API that expires unsettled is final
-- at its estimate with status 'expired'. SQLite cannot change a CHECK
-- constraint in place: the table is rebuilt, with its indexes.
CREATE TABLE ledger_entries_new (
    request_id       TEXT PRIMARY KEY,
    node             TEXT NOT NULL,
    tenant           TEXT NOT NULL,
    user_id          TEXT NOT NULL,
    key_id           TEXT NOT NULL,
    route            TEXT NOT NULL,
    upstream         TEXT NOT NULL,
    model            TEXT NOT NULL,
    region           TEXT NOT NULL,
    decision         TEXT NOT NULL,
    policy           TEXT NOT NULL,
    friction         TEXT NOT NULL,
    status           TEXT NOT NULL CHECK (status IN ('reserved', 'settled', 'recovered', 'failed', 'expired')),
    http_status      INTEGER NOT NULL,
    est_input        INTEGER NOT NULL,
    est_cached_input INTEGER NOT NULL,
    est_cache_write  INTEGER NOT NULL,
    est_output       INTEGER NOT NULL,
    est_reasoning    INTEGER NOT NULL,
    est_units        INTEGER NOT NULL,
    act_input        INTEGER NOT NULL,
    act_cached_input INTEGER NOT NULL,
    act_cache_write  INTEGER NOT NULL,
    act_output       INTEGER NOT NULL,
    act_reasoning    INTEGER NOT NULL,
    act_units        INTEGER NOT NULL,
    estimated_cost   INTEGER NOT NULL,
    actual_cost      INTEGER NOT NULL,
    cost             INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    settled_at       INTEGER NOT NULL
) WITHOUT ROWID;

INSERT INTO ledger_entries_new SELECT * FROM ledger_entries;
DROP TABLE ledger_entries;
ALTER TABLE ledger_entries_new RENAME TO ledger_entries;
CREATE INDEX ledger_entries_tenant_time ON ledger_entries (tenant, created_at, request_id);
CREATE INDEX ledger_entries_time ON ledger_entries (created_at, request_id);
