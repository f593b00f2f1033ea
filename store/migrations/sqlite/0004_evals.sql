-- samewise schema v4 (SQLite): eval jobs, their per-item results, per-endpoint cooldowns.
-- Timestamps are INTEGER unix milliseconds; JSON documents are TEXT (parsed by the store).

CREATE TABLE eval_jobs (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    model          TEXT    NOT NULL,
    endpoint       TEXT    NOT NULL,
    suite          TEXT    NOT NULL,
    baseline       TEXT    NOT NULL,
    alert_id       INTEGER,
    params         TEXT    NOT NULL,
    state          TEXT    NOT NULL
        CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    created_ms     INTEGER  NOT NULL,
    updated_ms     INTEGER  NOT NULL,
    started_ms     INTEGER,
    finished_ms    INTEGER,
    attempts       INTEGER NOT NULL DEFAULT 0,
    max_attempts   INTEGER NOT NULL,
    worker         TEXT,
    lease_until_ms INTEGER,
    items_total    INTEGER,
    tokens         INTEGER  NOT NULL DEFAULT 0,
    verdict        TEXT,
    error          TEXT
);

-- claiming: the oldest queued job, or a running one whose lease expired
CREATE INDEX eval_jobs_state_id ON eval_jobs (state, id);
CREATE INDEX eval_jobs_alert ON eval_jobs (alert_id);

CREATE TABLE eval_results (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id     INTEGER  NOT NULL REFERENCES eval_jobs (id) ON DELETE CASCADE,
    item       TEXT    NOT NULL,
    target     TEXT    NOT NULL,
    passed     BOOLEAN NOT NULL,
    error_type TEXT,
    tokens     INTEGER  NOT NULL,
    record     TEXT    NOT NULL,
    created_ms INTEGER  NOT NULL
);

-- an item's result is written exactly once per job and target, whoever resumes the job
CREATE UNIQUE INDEX eval_results_once ON eval_results (job_id, item, target);

-- at most one job per endpoint and suite per cooldown window, across gateways
CREATE TABLE eval_cooldowns (
    endpoint TEXT   NOT NULL,
    suite    TEXT   NOT NULL,
    until_ms INTEGER NOT NULL,
    PRIMARY KEY (endpoint, suite)
);
