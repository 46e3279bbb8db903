CREATE TABLE IF NOT EXISTS control_version (
    id  INTEGER PRIMARY KEY,
    seq BIGINT NOT NULL
);
INSERT INTO control_version (id, seq) VALUES (1, 0) ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS control_entities (
    id         TEXT PRIMARY KEY,
    kind       TEXT NOT NULL,
    tenant     TEXT NOT NULL,
    name       TEXT NOT NULL,
    key_hash   TEXT UNIQUE,
    old_hash   TEXT,
    old_until  BIGINT NOT NULL DEFAULT 0,
    spec       TEXT NOT NULL,
    seq        BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS control_entities_name ON control_entities (kind, tenant, name);
CREATE INDEX IF NOT EXISTS control_entities_seq ON control_entities (seq);

CREATE TABLE IF NOT EXISTS control_audit (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at       BIGINT NOT NULL,
    actor    TEXT NOT NULL,
    action   TEXT NOT NULL,
    kind     TEXT NOT NULL,
    entity   TEXT NOT NULL,
    tenant   TEXT NOT NULL,
    detail   TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS control_audit_entity ON control_audit (entity, id);

CREATE TABLE IF NOT EXISTS control_alerts (
    idem         TEXT PRIMARY KEY,
    type         TEXT NOT NULL,
    payload      TEXT NOT NULL,
    status       TEXT NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    next_at      BIGINT NOT NULL,
    locked_until BIGINT NOT NULL DEFAULT 0,
    created_at   BIGINT NOT NULL,
    delivered_at BIGINT NOT NULL DEFAULT 0,
    last_error   TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS control_alerts_due ON control_alerts (status, next_at);
