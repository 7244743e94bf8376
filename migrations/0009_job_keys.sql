-- Unique jobs over time (NewJob::unique_key, #[job(unique = true, unique_period = "1h")]): one row
-- per (namespace, kind, key), naming the job that holds the key - the last one inserted with it -
-- and until when a period holds it. forge.jobs_enqueue locks this row (INSERT ... ON CONFLICT DO
-- UPDATE) before it decides, so concurrent enqueues of one key, from any node and inside callers'
-- transactions, are decided one after the other: the second waits for the first's transaction
-- to end and then sees its job. The row outlives its job: a period is honoured after the job was
-- pruned (a job whose row is gone counts as completed). forge.prune_job_keys deletes the rows
-- whose job is gone and whose period is over.
CREATE TABLE forge.job_keys (
    namespace   text        NOT NULL,
    kind        text        NOT NULL,
    unique_key  text        NOT NULL,
    -- The job that holds the key (the last inserted with it; its row may have been pruned).
    job_id      bigint      NOT NULL,
    -- When that job was enqueued (database clock), and until when its period holds the key
    -- (NULL: no period; the holder's state alone decides).
    enqueued_at timestamptz NOT NULL,
    held_until  timestamptz,
    PRIMARY KEY (namespace, kind, unique_key)
);

COMMENT ON TABLE forge.job_keys IS
    'Unique job keys: the job that holds each (namespace, kind, key), and until when its period holds it. Locked by forge.jobs_enqueue to decide a duplicate; outlives the job; pruned by forge.prune_job_keys.';

-- The keys of the unfinished unique jobs enqueued before this migration.
INSERT INTO forge.job_keys (namespace, kind, unique_key, job_id, enqueued_at, held_until)
SELECT DISTINCT ON (namespace, kind, unique_key) namespace, kind, unique_key, id, created_at, NULL
  FROM forge.jobs
 WHERE unique_key IS NOT NULL AND state IN ('available', 'scheduled', 'running', 'retryable')
 ORDER BY namespace, kind, unique_key, id DESC;

-- The key table decides now: the index allowed no second unfinished job of a key, which a
-- debounce (unique_mode = replace) needs while the holder runs.
DROP INDEX forge.jobs_unique;
