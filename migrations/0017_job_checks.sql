-- The CHECK constraints of forge.jobs_live (max_attempts and timeout_ms at least 1, parents_left
-- not negative, on_parent_failure 'cancel' or 'run') go. PostgreSQL evaluates every CHECK of a
-- table at every insert and every update of it - a claim's too, which writes none of those
-- columns - and reads each from its stored node tree at every statement: 67k instructions of a
-- one-job round trip of forge.jobs_step and 66k of a one-job enqueue (about 5 % of each,
-- tools/exp35/one_job_callgrind.sh; docs/src/experiments.md). The values are checked where
-- they are written instead: forge.jobs_enqueue refuses max_attempts or timeout_ms below 1 (the
-- Rust API before it), and parents_left and on_parent_failure are written by FORGE's functions
-- alone (forge.jobs_after, forge.jobs_parent_finished).
ALTER TABLE forge.jobs_live
    DROP CONSTRAINT IF EXISTS jobs_max_attempts_check,
    DROP CONSTRAINT IF EXISTS jobs_timeout_ms_check,
    DROP CONSTRAINT IF EXISTS jobs_parents_left_check,
    DROP CONSTRAINT IF EXISTS jobs_on_parent_failure_check;
