-- samewise schema v11 (SQLite): who resolved an alert.
--
-- resolved_by is 'operator' when a person resolved it (the CLI, the admin API, the dashboard)
-- and 'quiet' when the detectors auto-resolved it after its quiet period without a new
-- confirmation. Only an operator's resolution of a "changed" alert accepts the endpoint's new
-- behaviour as the changed? detector's new baseline: a quiet period alone does not, since a
-- small lasting shift can alarm less often than once per quiet period. NULL while the alert
-- is active, and for alerts resolved before this version (counted as an operator's, as they
-- were then).

ALTER TABLE alerts ADD COLUMN resolved_by TEXT CHECK (resolved_by IN ('operator', 'quiet'));
