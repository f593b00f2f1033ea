-- samewise schema v1 (SQLite): request records and API keys.
-- Timestamps are INTEGER unix milliseconds; booleans are declared BOOLEAN (stored 0/1).

CREATE TABLE request_records (
    request_id           TEXT    NOT NULL,
    attempt              INTEGER NOT NULL,
    final_attempt        BOOLEAN NOT NULL,
    ts_ms                INTEGER NOT NULL,
    key_id               INTEGER,
    model                TEXT    NOT NULL,
    provider             TEXT,
    endpoint             TEXT,
    route                TEXT    NOT NULL,
    stream               BOOLEAN NOT NULL,
    status               INTEGER,
    error_kind           TEXT,
    attempts             INTEGER NOT NULL,
    ttft_ms              REAL,
    latency_ms           REAL    NOT NULL,
    tpot_ms              REAL,
    prompt_tokens        INTEGER,
    completion_tokens    INTEGER,
    usage_counted        BOOLEAN NOT NULL,
    finish_reason        TEXT,
    output_chars         INTEGER NOT NULL,
    cost_usd             REAL,
    tool_calls           INTEGER NOT NULL,
    tool_invalid_json    INTEGER NOT NULL,
    tool_unknown_name    INTEGER NOT NULL,
    tool_schema_mismatch INTEGER NOT NULL,
    tool_finish_mismatch TEXT,
    tool_errored         BOOLEAN NOT NULL,
    degenerate           BOOLEAN NOT NULL,
    PRIMARY KEY (request_id, attempt)
);

-- newest-first listings and retention deletes
CREATE INDEX request_records_ts ON request_records (ts_ms);
-- per-model and per-endpoint time windows (dashboards, passive drift statistics)
CREATE INDEX request_records_model_ts ON request_records (model, ts_ms);
CREATE INDEX request_records_endpoint_ts ON request_records (endpoint, ts_ms);

CREATE TABLE api_keys (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    name       TEXT    NOT NULL,
    key_hash   TEXT    NOT NULL UNIQUE,
    prefix     TEXT    NOT NULL,
    rpm_limit  INTEGER,
    created_ms INTEGER NOT NULL,
    revoked_ms INTEGER
);

-- a name identifies at most one live key; revoked keys keep their name for the record
CREATE UNIQUE INDEX api_keys_live_name ON api_keys (name) WHERE revoked_ms IS NULL;
