-- samewise schema v3 (PostgreSQL): admin keys and per-endpoint per-minute rollups.
-- The rollups are kept up to date by the record writer in the same transaction as the
-- request records they count (only newly inserted records are counted), so pages and the
-- JSON API read these instead of raw rows. They are not touched by request-record
-- retention: they are kept longer than raw rows.

ALTER TABLE api_keys ADD COLUMN admin BOOLEAN NOT NULL DEFAULT FALSE;

-- one row per endpoint per UTC minute; every count is over upstream attempts (records with
-- an endpoint). Latency histograms have fixed buckets (bounds in samewise_store::rollups):
-- ttft_hN and tpot_hN count attempts whose TTFT / TPOT fell in bucket N (the last is open).
CREATE TABLE endpoint_minutes (
    endpoint             TEXT   NOT NULL,
    minute_ms            BIGINT NOT NULL,
    model                TEXT   NOT NULL,
    requests             BIGINT NOT NULL DEFAULT 0,
    final_requests       BIGINT NOT NULL DEFAULT 0,
    errors               BIGINT NOT NULL DEFAULT 0,
    tool_requests        BIGINT NOT NULL DEFAULT 0,
    tool_errored         BIGINT NOT NULL DEFAULT 0,
    tool_calls           BIGINT NOT NULL DEFAULT 0,
    tool_invalid_json    BIGINT NOT NULL DEFAULT 0,
    tool_unknown_name    BIGINT NOT NULL DEFAULT 0,
    tool_schema_mismatch BIGINT NOT NULL DEFAULT 0,
    tool_finish_mismatch BIGINT NOT NULL DEFAULT 0,
    degenerate           BIGINT NOT NULL DEFAULT 0,
    prompt_tokens        BIGINT NOT NULL DEFAULT 0,
    completion_tokens    BIGINT NOT NULL DEFAULT 0,
    ttft_h0  BIGINT NOT NULL DEFAULT 0,
    ttft_h1  BIGINT NOT NULL DEFAULT 0,
    ttft_h2  BIGINT NOT NULL DEFAULT 0,
    ttft_h3  BIGINT NOT NULL DEFAULT 0,
    ttft_h4  BIGINT NOT NULL DEFAULT 0,
    ttft_h5  BIGINT NOT NULL DEFAULT 0,
    ttft_h6  BIGINT NOT NULL DEFAULT 0,
    ttft_h7  BIGINT NOT NULL DEFAULT 0,
    ttft_h8  BIGINT NOT NULL DEFAULT 0,
    ttft_h9  BIGINT NOT NULL DEFAULT 0,
    ttft_h10 BIGINT NOT NULL DEFAULT 0,
    ttft_h11 BIGINT NOT NULL DEFAULT 0,
    ttft_h12 BIGINT NOT NULL DEFAULT 0,
    tpot_h0  BIGINT NOT NULL DEFAULT 0,
    tpot_h1  BIGINT NOT NULL DEFAULT 0,
    tpot_h2  BIGINT NOT NULL DEFAULT 0,
    tpot_h3  BIGINT NOT NULL DEFAULT 0,
    tpot_h4  BIGINT NOT NULL DEFAULT 0,
    tpot_h5  BIGINT NOT NULL DEFAULT 0,
    tpot_h6  BIGINT NOT NULL DEFAULT 0,
    tpot_h7  BIGINT NOT NULL DEFAULT 0,
    tpot_h8  BIGINT NOT NULL DEFAULT 0,
    tpot_h9  BIGINT NOT NULL DEFAULT 0,
    tpot_h10 BIGINT NOT NULL DEFAULT 0,
    tpot_h11 BIGINT NOT NULL DEFAULT 0,
    tpot_h12 BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (endpoint, minute_ms)
);

-- a model's endpoints over a time range (the overview)
CREATE INDEX endpoint_minutes_model_minute ON endpoint_minutes (model, minute_ms);
CREATE INDEX endpoint_minutes_minute ON endpoint_minutes (minute_ms);

-- labelled counts per endpoint per minute: dim 'error_kind' or 'finish_reason', label the
-- value as recorded (bounded in length by the store).
CREATE TABLE endpoint_minute_labels (
    endpoint  TEXT   NOT NULL,
    minute_ms BIGINT NOT NULL,
    dim       TEXT   NOT NULL,
    label     TEXT   NOT NULL,
    n         BIGINT NOT NULL,
    PRIMARY KEY (endpoint, minute_ms, dim, label)
);

-- the same sums per endpoint per UTC hour, upserted in the same transaction: long ranges read
-- whole hours here and only their partial edges from the minute tables.
CREATE TABLE endpoint_hours (
    endpoint             TEXT   NOT NULL,
    hour_ms              BIGINT NOT NULL,
    model                TEXT   NOT NULL,
    requests             BIGINT NOT NULL DEFAULT 0,
    final_requests       BIGINT NOT NULL DEFAULT 0,
    errors               BIGINT NOT NULL DEFAULT 0,
    tool_requests        BIGINT NOT NULL DEFAULT 0,
    tool_errored         BIGINT NOT NULL DEFAULT 0,
    tool_calls           BIGINT NOT NULL DEFAULT 0,
    tool_invalid_json    BIGINT NOT NULL DEFAULT 0,
    tool_unknown_name    BIGINT NOT NULL DEFAULT 0,
    tool_schema_mismatch BIGINT NOT NULL DEFAULT 0,
    tool_finish_mismatch BIGINT NOT NULL DEFAULT 0,
    degenerate           BIGINT NOT NULL DEFAULT 0,
    prompt_tokens        BIGINT NOT NULL DEFAULT 0,
    completion_tokens    BIGINT NOT NULL DEFAULT 0,
    ttft_h0  BIGINT NOT NULL DEFAULT 0,
    ttft_h1  BIGINT NOT NULL DEFAULT 0,
    ttft_h2  BIGINT NOT NULL DEFAULT 0,
    ttft_h3  BIGINT NOT NULL DEFAULT 0,
    ttft_h4  BIGINT NOT NULL DEFAULT 0,
    ttft_h5  BIGINT NOT NULL DEFAULT 0,
    ttft_h6  BIGINT NOT NULL DEFAULT 0,
    ttft_h7  BIGINT NOT NULL DEFAULT 0,
    ttft_h8  BIGINT NOT NULL DEFAULT 0,
    ttft_h9  BIGINT NOT NULL DEFAULT 0,
    ttft_h10 BIGINT NOT NULL DEFAULT 0,
    ttft_h11 BIGINT NOT NULL DEFAULT 0,
    ttft_h12 BIGINT NOT NULL DEFAULT 0,
    tpot_h0  BIGINT NOT NULL DEFAULT 0,
    tpot_h1  BIGINT NOT NULL DEFAULT 0,
    tpot_h2  BIGINT NOT NULL DEFAULT 0,
    tpot_h3  BIGINT NOT NULL DEFAULT 0,
    tpot_h4  BIGINT NOT NULL DEFAULT 0,
    tpot_h5  BIGINT NOT NULL DEFAULT 0,
    tpot_h6  BIGINT NOT NULL DEFAULT 0,
    tpot_h7  BIGINT NOT NULL DEFAULT 0,
    tpot_h8  BIGINT NOT NULL DEFAULT 0,
    tpot_h9  BIGINT NOT NULL DEFAULT 0,
    tpot_h10 BIGINT NOT NULL DEFAULT 0,
    tpot_h11 BIGINT NOT NULL DEFAULT 0,
    tpot_h12 BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (endpoint, hour_ms)
);

CREATE INDEX endpoint_hours_model_hour ON endpoint_hours (model, hour_ms);
CREATE INDEX endpoint_hours_hour ON endpoint_hours (hour_ms);

CREATE TABLE endpoint_hour_labels (
    endpoint  TEXT   NOT NULL,
    hour_ms   BIGINT NOT NULL,
    dim       TEXT   NOT NULL,
    label     TEXT   NOT NULL,
    n         BIGINT NOT NULL,
    PRIMARY KEY (endpoint, hour_ms, dim, label)
);
