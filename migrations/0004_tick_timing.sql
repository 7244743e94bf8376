-- When a tick's handler started and how long it ran, as the leader that ran it measured them
-- (the same figures as forge_cron_lag_seconds and forge_cron_run_duration_seconds): the claim
-- is made ahead of the instant ([cron] claim_ahead), so claimed_at says nothing about either.
ALTER TABLE forge.cron_ticks
    ADD COLUMN started_at  timestamptz,
    ADD COLUMN duration_ms double precision;

COMMENT ON COLUMN forge.cron_ticks.started_at IS
    'When the handler started, by the clock of the leader that ran it (NULL: it never started: skipped, abandoned, or still to start). Lag = started_at - scheduled_at.';

COMMENT ON COLUMN forge.cron_ticks.duration_ms IS
    'How long the handler ran, by the monotonic clock of the leader that ran it (NULL until its outcome is recorded).';
