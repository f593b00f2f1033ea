-- samewise schema v8 (PostgreSQL): each API key's usage per hour, for `samewise keys usage`.
--
-- key_hours: one row per key and UTC hour, upserted in the records' transaction from the
-- newly inserted records that carry a key (a record already stored is not counted again), so
-- a usage window reads its whole hours here and only the records of the partial hour at its
-- start. requests and failed count final attempts (failed: an error kind, no status, or a
-- status of 400 or more); attempts counts upstream attempts (attempt > 0); tokens and cost
-- are summed over every record; last_ms is the newest record's time. Cut by the rollups'
-- retention. Filled here from the records already stored.

CREATE TABLE key_hours (
    key_id            BIGINT  NOT NULL,
    hour_ms           BIGINT  NOT NULL,
    requests          BIGINT  NOT NULL,
    failed            BIGINT  NOT NULL,
    attempts          BIGINT  NOT NULL,
    prompt_tokens     BIGINT  NOT NULL,
    completion_tokens BIGINT  NOT NULL,
    cost_usd          DOUBLE PRECISION NOT NULL,
    last_ms           BIGINT  NOT NULL,
    PRIMARY KEY (key_id, hour_ms)
);

CREATE INDEX key_hours_hour ON key_hours (hour_ms);

INSERT INTO key_hours (key_id, hour_ms, requests, failed, attempts, prompt_tokens,
                       completion_tokens, cost_usd, last_ms)
SELECT key_id, (ts_ms / 3600000) * 3600000,
       SUM(CASE WHEN final_attempt THEN 1 ELSE 0 END),
       SUM(CASE WHEN final_attempt AND (error_kind IS NOT NULL OR status IS NULL
                                        OR status >= 400) THEN 1 ELSE 0 END),
       SUM(CASE WHEN attempt > 0 THEN 1 ELSE 0 END),
       COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0),
       COALESCE(SUM(cost_usd), 0.0), MAX(ts_ms)
FROM request_records WHERE key_id IS NOT NULL AND ts_ms >= 0
GROUP BY key_id, (ts_ms / 3600000) * 3600000;
