-- samewise schema v10 (SQLite): the changed? detector's fixed baselines.
--
-- A CUSUM chart compares an endpoint's newest runs with its first cusum_baseline_rounds runs
-- of a probe kind (or the first after its last "changed" alert was resolved). The detector
-- stores those runs' values here once they are complete, one row per statistic, so that the
-- baseline stays fixed however many runs come after it (the detector reads only the newest
-- history_runs) and survives retention deleting its runs. after_ms is the resolution the
-- baseline follows (NULL: none); a newer resolution replaces the row. runs is a JSON array of
-- [id, started_ms, value], oldest first.

CREATE TABLE probe_baselines (
    model      TEXT   NOT NULL,
    endpoint   TEXT   NOT NULL,
    kind       TEXT   NOT NULL,
    statistic  TEXT   NOT NULL,
    after_ms   INTEGER,
    runs       TEXT   NOT NULL,
    created_ms INTEGER NOT NULL,
    PRIMARY KEY (model, endpoint, kind, statistic)
);
