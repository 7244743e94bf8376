-- Takes a limit lock of a claim (a queue's or a job kind's: a transaction-level advisory lock
-- on (p_class, p_key)), waiting at most p_wait_ms for it, and says whether it got it.
--
-- A claim waits for another claim's turn under the lock, a few milliseconds. But a claimant
-- that froze holding it (SIGSTOP, a VM pause) holds it until its sessions are ended (marked
-- down), and a round trip that waited that long would also hold back the outcomes it records
-- (they commit with its claim), and then fail at the session's lock_timeout, outcomes and all.
-- So the claim gives up instead: it takes nothing of what the lock guards this time, its
-- outcomes commit, and the worker claims again.
CREATE OR REPLACE FUNCTION forge.limit_lock(p_class text, p_key text, p_wait_ms integer)
RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_timeout text := current_setting('lock_timeout');
BEGIN
    -- Free (the common case): no subtransaction.
    IF pg_try_advisory_xact_lock(hashtext(p_class), hashtext(p_key)) THEN
        RETURN true;
    END IF;
    BEGIN
        PERFORM set_config('lock_timeout', p_wait_ms || 'ms', true);
        PERFORM pg_advisory_xact_lock(hashtext(p_class), hashtext(p_key));
        PERFORM set_config('lock_timeout', v_timeout, true);
        RETURN true;
    EXCEPTION WHEN lock_not_available THEN
        -- (The subtransaction's rollback put lock_timeout back.)
        RETURN false;
    END;
END;
$$;
