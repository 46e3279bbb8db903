-- Entries: one row per admitted request. Money is integer nano-dollars;
-- cost is the charge (estimated_cost while reserved, actual_cost once
-- final). settled_at is NULL while reserved.
CREATE TABLE ledger_entries (
    request_id       text PRIMARY KEY,
    node             text NOT NULL,
    tenant           text NOT NULL,
    user_id          text NOT NULL,
    key_id           text NOT NULL,
    route            text NOT NULL,
    upstream         text NOT NULL,
    model            text NOT NULL,
    region           text NOT NULL,
    decision         text NOT NULL,
    policy           text NOT NULL,
    friction         text NOT NULL,
    status           text NOT NULL CHECK (status IN ('reserved', 'settled', 'recovered', 'failed')),
    http_status      integer NOT NULL,
    est_input        bigint NOT NULL,
    est_cached_input bigint NOT NULL,
    est_cache_write  bigint NOT NULL,
    est_output       bigint NOT NULL,
    est_reasoning    bigint NOT NULL,
    est_units        bigint NOT NULL,
    act_input        bigint NOT NULL,
    act_cached_input bigint NOT NULL,
    act_cache_write  bigint NOT NULL,
    act_output       bigint NOT NULL,
    act_reasoning    bigint NOT NULL,
    act_units        bigint NOT NULL,
    estimated_cost   bigint NOT NULL,
    actual_cost      bigint NOT NULL,
    cost             bigint NOT NULL,
    created_at       timestamptz NOT NULL,
    settled_at       timestamptz
) WITH (fillfactor = 50); -- room on the page for the settlement: a heap-only update

-- No index involves status or a column a settlement changes, so that a
-- settlement is a heap-only (HOT) update that writes no index.

CREATE INDEX ledger_entries_tenant_time ON ledger_entries (tenant, created_at, request_id);
CREATE INDEX ledger_entries_time ON ledger_entries (created_at, request_id);

-- The open-since mark of each node: the earliest created_at of its
-- reservations that may still be open (NULL: none). Recovery looks at the
-- node's entries created since then. marker is the id of the last recovery
-- marker applied, so that a retried batch does not recover twice.
CREATE TABLE ledger_nodes (
    node       text PRIMARY KEY,
    open_since timestamptz,
    marker     text
);
-- Spend roll-up: the sum of the charges, and the number, of the entries
-- created in each bucket, per tenant and scope ('' the whole tenant,
-- 'u:USER', 'k:KEY', 'uk:LEN:USERKEY'), at two grains: 0 for 15-minute
-- buckets, 1 for UTC days. bucket is the start of the bucket.
CREATE TABLE ledger_spend (
    tenant  text NOT NULL,
    scope   text NOT NULL,
    grain   smallint NOT NULL,
    bucket  timestamptz NOT NULL,
    cost    bigint NOT NULL,
    entries bigint NOT NULL,
    PRIMARY KEY (tenant, scope, grain, bucket)
);

CREATE INDEX ledger_spend_period ON ledger_spend (scope, grain, bucket);
