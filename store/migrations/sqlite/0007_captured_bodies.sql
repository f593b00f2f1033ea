-- samewise schema v7 (SQLite): captured request bodies and regression cases (issue #10).
--
-- captured_bodies: opt-in per model ([models.NAME.capture]), off by default. One row per
-- flagged client request (a degenerate cut, a tool-call error, an upstream error, or a
-- sampled one): the request body as the client sent it with auth-looking fields redacted
-- (never headers) and the assembled answer of the final attempt (text, tool calls, finish
-- reason; for streams the assembled result, not the raw events). Bounded per model in total
-- bytes (the oldest evicted first) and in age (expires_ms), both enforced by the writer's
-- statements in the transaction that inserts; deleted by `samewise bodies purge`.
--
-- regression_cases: the `regression` suite of a model, made by `samewise evals capture`
-- from captured bodies: a chat request and its check (a customer-suite item), the
-- expectation being the baseline's answer. One case per (model, suite, source request).

CREATE TABLE captured_bodies (
    request_id TEXT    PRIMARY KEY,
    ts_ms      INTEGER NOT NULL,
    expires_ms INTEGER NOT NULL,
    model      TEXT    NOT NULL,
    endpoint   TEXT,
    route      TEXT    NOT NULL,
    flags      TEXT    NOT NULL,
    request    TEXT    NOT NULL,
    response   TEXT    NOT NULL,
    bytes      INTEGER NOT NULL
);

CREATE INDEX captured_bodies_model_ts ON captured_bodies (model, ts_ms);
CREATE INDEX captured_bodies_endpoint_ts ON captured_bodies (endpoint, ts_ms);
CREATE INDEX captured_bodies_expires ON captured_bodies (expires_ms);

CREATE TABLE regression_cases (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    model             TEXT    NOT NULL,
    suite             TEXT    NOT NULL,
    source_request_id TEXT    NOT NULL,
    endpoint          TEXT,
    alert_id          INTEGER,
    item              TEXT    NOT NULL,
    created_ms        INTEGER NOT NULL,
    UNIQUE (model, suite, source_request_id)
);
