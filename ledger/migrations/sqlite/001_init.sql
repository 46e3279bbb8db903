-- Entries: one row per admitted request. Times are Unix microseconds (UTC);
-- settled_at is 0 while reserved. Money is integer nano-dollars; cost is the
-- charge (estimated_cost while reserved, actual_cost once final).
CREATE TABLE ledger_entries (
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
    status           TEXT NOT NULL CHECK (status IN ('reserved', 'settled', 'recovered', 'failed')),
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

CREATE INDEX ledger_entries_tenant_time ON ledger_entries (tenant, created_at, request_id);
CREATE INDEX ledger_entries_time ON ledger_entries (created_at, request_id);

-- The open-since mark of each node: the earliest created_at of its
-- reservations that may still be open (0: none). marker is the id of the
-- last recovery marker applied, so that a retried batch does not recover
-- twice.
CREATE TABLE ledger_nodes (
    node       TEXT PRIMARY KEY,
    open_since INTEGER NOT NULL,
    marker     TEXT
) WITHOUT ROWID;
-- Spend roll-up: the sum of the charges, and the number, of the entries
-- created in each bucket, per tenant and scope ('' the whole tenant,
-- 'u:USER', 'k:KEY', 'uk:LEN:USERKEY'), at two grains: 0 for 15-minute
-- buckets, 1 for UTC days. bucket is the start of the bucket (Unix microseconds).
CREATE TABLE ledger_spend (
    tenant  TEXT NOT NULL,
    scope   TEXT NOT NULL,
    grain   INTEGER NOT NULL,
    bucket  INTEGER NOT NULL,
    cost    INTEGER NOT NULL,
    entries INTEGER NOT NULL,
    PRIMARY KEY (tenant, scope, grain, bucket)
) WITHOUT ROWID;

CREATE INDEX ledger_spend_period ON ledger_spend (scope, grain, bucket);
