-- The gate before a claimed tick's handler starts: the database's time, if the calling session
-- is the lock session of the role's current tenure (forge.tenure_current); NULL otherwise. A
-- read: no lock, no commit to wait for. The caller starts the handlers of the ticks whose
-- instant is at or before the answer.
--
-- Ticks are claimed shortly before their instant ([cron] claim_ahead; docs/src/architecture/crons.md,
-- "Claiming ahead"), so that the claim's durable commit is not on the firing path. The rule
-- that keeps this exactly-once: a leader starts the handler of a tick only after this gate, run
-- on the role's lock session, has answered with a database time at or after the tick's instant.
-- The gate answers only while that session is the current, unreleased tenure's; a newer
-- tenure's acquired_at is read from the clock after its lock was granted, which is after the
-- older tenure's lock session ended or unlocked, so after every gate the older tenure passed.
-- Hence: a tick claimed by an older tenure whose instant is at or after the current tenure's
-- acquired_at was never started. The new leader deletes those claims
-- (forge.tick_unclaim_unstarted) and claims the ticks again as its own; a leader that hands over
-- deletes its own claims of ticks it will not start (forge.tick_unclaim). Every other tick an
-- older tenure left running may have started, and follows the cron's `interrupted` policy.
-- Manual ticks are claimed after their instant, never ahead.
CREATE OR REPLACE FUNCTION forge.tick_gate(p_namespace text, p_role text, p_epoch bigint, p_tenure bigint)
RETURNS timestamptz
LANGUAGE sql
AS $$
    SELECT clock_timestamp() FROM forge.leaders l
     WHERE l.namespace = p_namespace AND l.role = p_role AND l.epoch = p_epoch
       AND l.tenure = p_tenure AND l.backend_pid = pg_backend_pid()
       AND forge.tenure_current(l);
$$;
