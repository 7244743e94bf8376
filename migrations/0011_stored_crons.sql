-- Crons stored in the database (issue 34): an operator creates, changes and deletes them at run
-- time (forge.cron_store, forge.cron_unstore: Workload::upsert_cron, the admin API, the CLI).
-- A stored cron is a row of forge.crons with a job: at each tick the scheduler's leader enqueues
-- that job in the tick's completion transaction, so a tick enqueues it exactly once. It shares
-- everything else with the crons of code: the tick ledger, pauses, "trigger now", the views.
-- A row without a job is a cron of code, registered by the nodes that have it.
ALTER TABLE forge.crons
    ADD COLUMN job_kind  text,
    ADD COLUMN job_args  jsonb,
    -- The cron's policies, as words and milliseconds: {"catch_up": "latest",
    -- "catch_up_window_ms": 86400000, "overlap": null, "interrupted": "rerun", "timeout_ms": null}.
    ADD COLUMN options   jsonb,
    ADD COLUMN stored_at timestamptz,
    ADD COLUMN stored_by text,
    ADD CONSTRAINT crons_stored_whole CHECK (
        (job_kind IS NULL) = (job_args IS NULL) AND (job_kind IS NULL) = (options IS NULL));

COMMENT ON COLUMN forge.crons.job_kind IS
    'Set for a cron stored in the database: the kind of the job its ticks enqueue (with job_args). NULL for a cron of code.';
