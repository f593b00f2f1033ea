-- samewise schema v9 (PostgreSQL): indexes for the retention of probe runs.
--
-- Retention clears a run's per-position data (raw) once it is older than probe_raw_days and
-- deletes the run once it is older than rollups_days, oldest first, a bounded step at a time.
-- probe_runs_raw_started holds only the runs that still have raw data, so each step finds its
-- oldest directly instead of walking every run cleared before; probe_runs_started finds the
-- oldest runs to delete. A deleted run sets repeat_of to NULL in the run that repeated it
-- (ON DELETE SET NULL): probe_runs_repeat_of finds that run without scanning the table once
-- for every run deleted.

CREATE INDEX probe_runs_raw_started ON probe_runs (started_ms) WHERE raw IS NOT NULL;
CREATE INDEX probe_runs_started ON probe_runs (started_ms);
CREATE INDEX probe_runs_repeat_of ON probe_runs (repeat_of) WHERE repeat_of IS NOT NULL;
