-- samewise schema v3 (SQLite): admin keys and per-endpoint per-minute rollups.
-- The rollups are kept up to date by the record writer in the same transaction as the
-- request records they count (only newly inserted records are counted), so pages and the
-- JSON API read these instead of raw rows. They are not touched by request-record
-- retention: they are kept longer than raw rows.

ALTER TABLE api_keys ADD COLUMN admin BOOLEAN NOT NULL DEFAULT 0;

-- one row per endpoint per UTC minute; every count is over upstream attempts (records with
-- an endpoint). Latency histograms have fixed buckets (bounds in samewise_store::rollups):
-- ttft_hN and tpot_hN count attempts whose TTFT / TPOT fell in bucket N (the last is open).
CREATE TABLE endpoint_minutes (
    endpoint             TEXT   NOT NULL,
    minute_ms            INTEGER NOT NULL,
    model                TEXT   NOT NULL,
    requests             INTEGER NOT NULL DEFAULT 0,
    final_requests       INTEGER NOT NULL DEFAULT 0,
    errors               INTEGER NOT NULL DEFAULT 0,
    tool_requests        INTEGER NOT NULL DEFAULT 0,
    tool_errored         INTEGER NOT NULL DEFAULT 0,
    tool_calls           INTEGER NOT NULL DEFAULT 0,
    tool_invalid_json    INTEGER NOT NULL DEFAULT 0,
    tool_unknown_name    INTEGER NOT NULL DEFAULT 0,
    tool_schema_mismatch INTEGER NOT NULL DEFAULT 0,
    tool_finish_mismatch INTEGER NOT NULL DEFAULT 0,
    degenerate           INTEGER NOT NULL DEFAULT 0,
    prompt_tokens        INTEGER NOT NULL DEFAULT 0,
    completion_tokens    INTEGER NOT NULL DEFAULT 0,
    ttft_h0  INTEGER NOT NULL DEFAULT 0,
    ttft_h1  INTEGER NOT NULL DEFAULT 0,
    ttft_h2  INTEGER NOT NULL DEFAULT 0,
    ttft_h3  INTEGER NOT NULL DEFAULT 0,
    ttft_h4  INTEGER NOT NULL DEFAULT 0,
    ttft_h5  INTEGER NOT NULL DEFAULT 0,
    ttft_h6  INTEGER NOT NULL DEFAULT 0,
    ttft_h7  INTEGER NOT NULL DEFAULT 0,
    ttft_h8  INTEGER NOT NULL DEFAULT 0,
    ttft_h9  INTEGER NOT NULL DEFAULT 0,
    ttft_h10 INTEGER NOT NULL DEFAULT 0,
    ttft_h11 INTEGER NOT NULL DEFAULT 0,
    ttft_h12 INTEGER NOT NULL DEFAULT 0,
    tpot_h0  INTEGER NOT NULL DEFAULT 0,
    tpot_h1  INTEGER NOT NULL DEFAULT 0,
    tpot_h2  INTEGER NOT NULL DEFAULT 0,
    tpot_h3  INTEGER NOT NULL DEFAULT 0,
    tpot_h4  INTEGER NOT NULL DEFAULT 0,
    tpot_h5  INTEGER NOT NULL DEFAULT 0,
    tpot_h6  INTEGER NOT NULL DEFAULT 0,
    tpot_h7  INTEGER NOT NULL DEFAULT 0,
    tpot_h8  INTEGER NOT NULL DEFAULT 0,
    tpot_h9  INTEGER NOT NULL DEFAULT 0,
    tpot_h10 INTEGER NOT NULL DEFAULT 0,
    tpot_h11 INTEGER NOT NULL DEFAULT 0,
    tpot_h12 INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (endpoint, minute_ms)
);

-- a model's endpoints over a time range (the overview)
CREATE INDEX endpoint_minutes_model_minute ON endpoint_minutes (model, minute_ms);
CREATE INDEX endpoint_minutes_minute ON endpoint_minutes (minute_ms);

-- labelled counts per endpoint per minute: dim 'error_kind' or 'finish_reason', label the
-- value as recorded (bounded in length by the store).
CREATE TABLE endpoint_minute_labels (
    endpoint  TEXT   NOT NULL,
    minute_ms INTEGER NOT NULL,
    dim       TEXT   NOT NULL,
    label     TEXT   NOT NULL,
    n         INTEGER NOT NULL,
    PRIMARY KEY (endpoint, minute_ms, dim, label)
);

-- the same sums per endpoint per UTC hour, upserted in the same transaction: long ranges read
-- whole hours here and only their partial edges from the minute tables.
CREATE TABLE endpoint_hours (
    endpoint             TEXT   NOT NULL,
    hour_ms              INTEGER NOT NULL,
    model                TEXT   NOT NULL,
    requests             INTEGER NOT NULL DEFAULT 0,
    final_requests       INTEGER NOT NULL DEFAULT 0,
    errors               INTEGER NOT NULL DEFAULT 0,
    tool_requests        INTEGER NOT NULL DEFAULT 0,
    tool_errored         INTEGER NOT NULL DEFAULT 0,
    tool_calls           INTEGER NOT NULL DEFAULT 0,
    tool_invalid_json    INTEGER NOT NULL DEFAULT 0,
    tool_unknown_name    INTEGER NOT NULL DEFAULT 0,
    tool_schema_mismatch INTEGER NOT NULL DEFAULT 0,
    tool_finish_mismatch INTEGER NOT NULL DEFAULT 0,
    degenerate           INTEGER NOT NULL DEFAULT 0,
    prompt_tokens        INTEGER NOT NULL DEFAULT 0,
    completion_tokens    INTEGER NOT NULL DEFAULT 0,
    ttft_h0  INTEGER NOT NULL DEFAULT 0,
    ttft_h1  INTEGER NOT NULL DEFAULT 0,
    ttft_h2  INTEGER NOT NULL DEFAULT 0,
    ttft_h3  INTEGER NOT NULL DEFAULT 0,
    ttft_h4  INTEGER NOT NULL DEFAULT 0,
    ttft_h5  INTEGER NOT NULL DEFAULT 0,
    ttft_h6  INTEGER NOT NULL DEFAULT 0,
    ttft_h7  INTEGER NOT NULL DEFAULT 0,
    ttft_h8  INTEGER NOT NULL DEFAULT 0,
    ttft_h9  INTEGER NOT NULL DEFAULT 0,
    ttft_h10 INTEGER NOT NULL DEFAULT 0,
    ttft_h11 INTEGER NOT NULL DEFAULT 0,
    ttft_h12 INTEGER NOT NULL DEFAULT 0,
    tpot_h0  INTEGER NOT NULL DEFAULT 0,
    tpot_h1  INTEGER NOT NULL DEFAULT 0,
    tpot_h2  INTEGER NOT NULL DEFAULT 0,
    tpot_h3  INTEGER NOT NULL DEFAULT 0,
    tpot_h4  INTEGER NOT NULL DEFAULT 0,
    tpot_h5  INTEGER NOT NULL DEFAULT 0,
    tpot_h6  INTEGER NOT NULL DEFAULT 0,
    tpot_h7  INTEGER NOT NULL DEFAULT 0,
    tpot_h8  INTEGER NOT NULL DEFAULT 0,
    tpot_h9  INTEGER NOT NULL DEFAULT 0,
    tpot_h10 INTEGER NOT NULL DEFAULT 0,
    tpot_h11 INTEGER NOT NULL DEFAULT 0,
    tpot_h12 INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (endpoint, hour_ms)
);

CREATE INDEX endpoint_hours_model_hour ON endpoint_hours (model, hour_ms);
CREATE INDEX endpoint_hours_hour ON endpoint_hours (hour_ms);

CREATE TABLE endpoint_hour_labels (
    endpoint  TEXT   NOT NULL,
    hour_ms   INTEGER NOT NULL,
    dim       TEXT   NOT NULL,
    label     TEXT   NOT NULL,
    n         INTEGER NOT NULL,
    PRIMARY KEY (endpoint, hour_ms, dim, label)
);
