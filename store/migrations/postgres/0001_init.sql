-- samewise schema v1 (PostgreSQL): request records and API keys.
-- Timestamps are BIGINT unix milliseconds. Integer columns are BIGINT so that every
-- unsigned counter of the Rust rows fits and decodes as i64.
--
-- request_records is partitioned by ts_ms, one partition per UTC day
-- (request_records_pYYYYMMDD, created ahead by the store), so retention drops whole days.
-- Rows outside every day partition land in request_records_default.

CREATE TABLE request_records (
    request_id           TEXT             NOT NULL,
    attempt              BIGINT           NOT NULL,
    final_attempt        BOOLEAN          NOT NULL,
    ts_ms                BIGINT           NOT NULL,
    key_id               BIGINT,
    model                TEXT             NOT NULL,
    provider             TEXT,
    endpoint             TEXT,
    route                TEXT             NOT NULL,
    stream               BOOLEAN          NOT NULL,
    status               BIGINT,
    error_kind           TEXT,
    attempts             BIGINT           NOT NULL,
    ttft_ms              DOUBLE PRECISION,
    latency_ms           DOUBLE PRECISION NOT NULL,
    tpot_ms              DOUBLE PRECISION,
    prompt_tokens        BIGINT,
    completion_tokens    BIGINT,
    usage_counted        BOOLEAN          NOT NULL,
    finish_reason        TEXT,
    output_chars         BIGINT           NOT NULL,
    cost_usd             DOUBLE PRECISION,
    tool_calls           BIGINT           NOT NULL,
    tool_invalid_json    BIGINT           NOT NULL,
    tool_unknown_name    BIGINT           NOT NULL,
    tool_schema_mismatch BIGINT           NOT NULL,
    tool_finish_mismatch TEXT,
    tool_errored         BOOLEAN          NOT NULL,
    degenerate           BOOLEAN          NOT NULL,
    -- a partitioned table's key must contain the partition column; the attempts of one
    -- request are written once, so (request_id, attempt) stays unique in practice
    PRIMARY KEY (request_id, attempt, ts_ms)
) PARTITION BY RANGE (ts_ms);

CREATE TABLE request_records_default PARTITION OF request_records DEFAULT;

-- newest-first listings and retention deletes (indexes cascade to every partition)
CREATE INDEX request_records_ts ON request_records (ts_ms);
-- per-model and per-endpoint time windows (dashboards, passive drift statistics)
CREATE INDEX request_records_model_ts ON request_records (model, ts_ms);
CREATE INDEX request_records_endpoint_ts ON request_records (endpoint, ts_ms);

CREATE TABLE api_keys (
    id         BIGSERIAL PRIMARY KEY,
    name       TEXT   NOT NULL,
    key_hash   TEXT   NOT NULL UNIQUE,
    prefix     TEXT   NOT NULL,
    rpm_limit  BIGINT,
    created_ms BIGINT NOT NULL,
    revoked_ms BIGINT
);

-- a name identifies at most one live key; revoked keys keep their name for the record
CREATE UNIQUE INDEX api_keys_live_name ON api_keys (name) WHERE revoked_ms IS NULL;
