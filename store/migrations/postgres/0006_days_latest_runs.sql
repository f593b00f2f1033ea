-- samewise schema v6 (PostgreSQL): day rollups and the probe-run summary.
--
-- endpoint_days / endpoint_day_labels: the rollups' sums per endpoint per UTC day, upserted by
-- the record writer in the same transaction as the minutes and hours. A 30-day range reads its
-- whole days here, the whole hours at its edges from the hours and only the partial hours from
-- the minutes (before: 720 hour rows per endpoint). Filled here from the hours already stored.
--
-- probe_run_latest: per (model, endpoint, kind, outcome) how many runs were stored and the
-- newest one, kept by insert_probe_run in the same transaction as the run. A long range's
-- latest verdict-bearing runs and /metrics' run counts read this small table instead of
-- grouping every run. Filled here from the runs already stored.

CREATE TABLE endpoint_days (
    endpoint             TEXT   NOT NULL,
    day_ms               BIGINT NOT NULL,
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
    ttft_h0              BIGINT NOT NULL DEFAULT 0,
    ttft_h1              BIGINT NOT NULL DEFAULT 0,
    ttft_h2              BIGINT NOT NULL DEFAULT 0,
    ttft_h3              BIGINT NOT NULL DEFAULT 0,
    ttft_h4              BIGINT NOT NULL DEFAULT 0,
    ttft_h5              BIGINT NOT NULL DEFAULT 0,
    ttft_h6              BIGINT NOT NULL DEFAULT 0,
    ttft_h7              BIGINT NOT NULL DEFAULT 0,
    ttft_h8              BIGINT NOT NULL DEFAULT 0,
    ttft_h9              BIGINT NOT NULL DEFAULT 0,
    ttft_h10             BIGINT NOT NULL DEFAULT 0,
    ttft_h11             BIGINT NOT NULL DEFAULT 0,
    ttft_h12             BIGINT NOT NULL DEFAULT 0,
    tpot_h0              BIGINT NOT NULL DEFAULT 0,
    tpot_h1              BIGINT NOT NULL DEFAULT 0,
    tpot_h2              BIGINT NOT NULL DEFAULT 0,
    tpot_h3              BIGINT NOT NULL DEFAULT 0,
    tpot_h4              BIGINT NOT NULL DEFAULT 0,
    tpot_h5              BIGINT NOT NULL DEFAULT 0,
    tpot_h6              BIGINT NOT NULL DEFAULT 0,
    tpot_h7              BIGINT NOT NULL DEFAULT 0,
    tpot_h8              BIGINT NOT NULL DEFAULT 0,
    tpot_h9              BIGINT NOT NULL DEFAULT 0,
    tpot_h10             BIGINT NOT NULL DEFAULT 0,
    tpot_h11             BIGINT NOT NULL DEFAULT 0,
    tpot_h12             BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (endpoint, day_ms)
);

CREATE INDEX endpoint_days_model_day ON endpoint_days (model, day_ms);
CREATE INDEX endpoint_days_day ON endpoint_days (day_ms);

CREATE TABLE endpoint_day_labels (
    endpoint  TEXT   NOT NULL,
    day_ms    BIGINT NOT NULL,
    dim       TEXT   NOT NULL,
    label     TEXT   NOT NULL,
    n         BIGINT NOT NULL,
    PRIMARY KEY (endpoint, day_ms, dim, label)
);

CREATE INDEX endpoint_day_labels_day ON endpoint_day_labels (day_ms);

-- hours are never negative (unix milliseconds), so integer division floors
INSERT INTO endpoint_days (endpoint, day_ms, model, requests, final_requests, errors, tool_requests, tool_errored, tool_calls, tool_invalid_json, tool_unknown_name, tool_schema_mismatch, tool_finish_mismatch, degenerate, prompt_tokens, completion_tokens, ttft_h0, ttft_h1, ttft_h2, ttft_h3, ttft_h4, ttft_h5, ttft_h6, ttft_h7, ttft_h8, ttft_h9, ttft_h10, ttft_h11, ttft_h12, tpot_h0, tpot_h1, tpot_h2, tpot_h3, tpot_h4, tpot_h5, tpot_h6, tpot_h7, tpot_h8, tpot_h9, tpot_h10, tpot_h11, tpot_h12)
SELECT endpoint, (hour_ms / 86400000) * 86400000, MIN(model), SUM(requests), SUM(final_requests), SUM(errors), SUM(tool_requests), SUM(tool_errored), SUM(tool_calls), SUM(tool_invalid_json), SUM(tool_unknown_name), SUM(tool_schema_mismatch), SUM(tool_finish_mismatch), SUM(degenerate), SUM(prompt_tokens), SUM(completion_tokens), SUM(ttft_h0), SUM(ttft_h1), SUM(ttft_h2), SUM(ttft_h3), SUM(ttft_h4), SUM(ttft_h5), SUM(ttft_h6), SUM(ttft_h7), SUM(ttft_h8), SUM(ttft_h9), SUM(ttft_h10), SUM(ttft_h11), SUM(ttft_h12), SUM(tpot_h0), SUM(tpot_h1), SUM(tpot_h2), SUM(tpot_h3), SUM(tpot_h4), SUM(tpot_h5), SUM(tpot_h6), SUM(tpot_h7), SUM(tpot_h8), SUM(tpot_h9), SUM(tpot_h10), SUM(tpot_h11), SUM(tpot_h12)
FROM endpoint_hours GROUP BY endpoint, (hour_ms / 86400000) * 86400000;

INSERT INTO endpoint_day_labels (endpoint, day_ms, dim, label, n)
SELECT endpoint, (hour_ms / 86400000) * 86400000, dim, label, SUM(n)
FROM endpoint_hour_labels GROUP BY endpoint, (hour_ms / 86400000) * 86400000, dim, label;

CREATE TABLE probe_run_latest (
    model      TEXT    NOT NULL,
    endpoint   TEXT    NOT NULL,
    kind       TEXT    NOT NULL,
    ok         BOOLEAN NOT NULL,
    runs       BIGINT  NOT NULL,
    run_id     BIGINT  NOT NULL,
    started_ms BIGINT  NOT NULL,
    PRIMARY KEY (model, endpoint, kind, ok)
);

CREATE INDEX probe_run_latest_started ON probe_run_latest (started_ms);

INSERT INTO probe_run_latest (model, endpoint, kind, ok, runs, run_id, started_ms)
SELECT model, endpoint, kind, ok, runs, id, started_ms FROM (
    SELECT model, endpoint, kind, ok, id, started_ms,
           ROW_NUMBER() OVER (PARTITION BY model, endpoint, kind, ok
                              ORDER BY started_ms DESC, id DESC) AS newest,
           COUNT(*) OVER (PARTITION BY model, endpoint, kind, ok) AS runs
    FROM probe_runs
) ranked WHERE newest = 1;
