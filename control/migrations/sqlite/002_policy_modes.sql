CREATE TABLE IF NOT EXISTS control_policy_replays (
    id            TEXT PRIMARY KEY,
    policy        TEXT NOT NULL,
    policy_sha256 TEXT NOT NULL,
    set_sha256    TEXT NOT NULL,
    report_sha256 TEXT NOT NULL,
    document      TEXT NOT NULL,
    actor         TEXT NOT NULL,
    created_at    BIGINT NOT NULL
);

CREATE TABLE IF NOT EXISTS control_policy_modes (
    policy        TEXT PRIMARY KEY,
    policy_sha256 TEXT NOT NULL,
    replay_id     TEXT NOT NULL,
    report_sha256 TEXT NOT NULL,
    actor         TEXT NOT NULL,
    promoted_at   BIGINT NOT NULL,
    seq           BIGINT NOT NULL
);
