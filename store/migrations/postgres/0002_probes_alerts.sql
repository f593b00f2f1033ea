-- samewise schema v2 (PostgreSQL): probe runs, alerts.
-- Timestamps are BIGINT unix milliseconds; JSON documents are TEXT (parsed by the store).

CREATE TABLE probe_runs (
    id          BIGSERIAL PRIMARY KEY,
    model       TEXT    NOT NULL,
    endpoint    TEXT    NOT NULL,
    kind        TEXT    NOT NULL,
    started_ms  BIGINT  NOT NULL,
    finished_ms BIGINT  NOT NULL,
    ok          BOOLEAN NOT NULL,
    error       TEXT,
    tokens      BIGINT  NOT NULL,
    stats       TEXT    NOT NULL,
    raw         BYTEA,
    repeat_of   BIGINT REFERENCES probe_runs (id) ON DELETE SET NULL
);

-- an endpoint's history (detectors, token budget) and a model's runs (listings)
CREATE INDEX probe_runs_endpoint_started ON probe_runs (endpoint, started_ms);
CREATE INDEX probe_runs_model_started ON probe_runs (model, started_ms);

CREATE TABLE alerts (
    id           BIGSERIAL PRIMARY KEY,
    model        TEXT   NOT NULL,
    endpoint     TEXT   NOT NULL,
    kind         TEXT   NOT NULL,
    state        TEXT   NOT NULL CHECK (state IN ('open', 'acknowledged', 'resolved')),
    opened_ms    BIGINT NOT NULL,
    updated_ms   BIGINT NOT NULL,
    resolved_ms  BIGINT,
    last_seen_ms BIGINT NOT NULL,
    summary      TEXT   NOT NULL,
    evidence     TEXT   NOT NULL
);

-- deduplication: at most one non-resolved alert per model, endpoint and kind
CREATE UNIQUE INDEX alerts_one_active ON alerts (model, endpoint, kind) WHERE state <> 'resolved';
CREATE INDEX alerts_state_updated ON alerts (state, updated_ms);
