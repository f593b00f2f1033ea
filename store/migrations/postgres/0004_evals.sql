-- samewise schema v4 (PostgreSQL): eval jobs, their per-item results, per-endpoint cooldowns.
-- Timestamps are BIGINT unix milliseconds; JSON documents are TEXT (parsed by the store).

CREATE TABLE eval_jobs (
    id             BIGSERIAL PRIMARY KEY,
    model          TEXT    NOT NULL,
    endpoint       TEXT    NOT NULL,
    suite          TEXT    NOT NULL,
    baseline       TEXT    NOT NULL,
    alert_id       BIGINT,
    params         TEXT    NOT NULL,
    state          TEXT    NOT NULL
        CHECK (state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    created_ms     BIGINT  NOT NULL,
    updated_ms     BIGINT  NOT NULL,
    started_ms     BIGINT,
    finished_ms    BIGINT,
    attempts       INTEGER NOT NULL DEFAULT 0,
    max_attempts   INTEGER NOT NULL,
    worker         TEXT,
    lease_until_ms BIGINT,
    items_total    INTEGER,
    tokens         BIGINT  NOT NULL DEFAULT 0,
    verdict        TEXT,
    error          TEXT
);

-- claiming: the oldest queued job, or a running one whose lease expired
CREATE INDEX eval_jobs_state_id ON eval_jobs (state, id);
CREATE INDEX eval_jobs_alert ON eval_jobs (alert_id);

CREATE TABLE eval_results (
    id         BIGSERIAL PRIMARY KEY,
    job_id     BIGINT  NOT NULL REFERENCES eval_jobs (id) ON DELETE CASCADE,
    item       TEXT    NOT NULL,
    target     TEXT    NOT NULL,
    passed     BOOLEAN NOT NULL,
    error_type TEXT,
    tokens     BIGINT  NOT NULL,
    record     TEXT    NOT NULL,
    created_ms BIGINT  NOT NULL
);

-- an item's result is written exactly once per job and target, whoever resumes the job
CREATE UNIQUE INDEX eval_results_once ON eval_results (job_id, item, target);

-- at most one job per endpoint and suite per cooldown window, across gateways
CREATE TABLE eval_cooldowns (
    endpoint TEXT   NOT NULL,
    suite    TEXT   NOT NULL,
    until_ms BIGINT NOT NULL,
    PRIMARY KEY (endpoint, suite)
);
