-- The fence. forge.fence_holds answers whether (epoch, tenure) is the role's tenure and it is
-- current (forge.tenure_current: unreleased, its lock session alive), and holds
-- FOR KEY SHARE on the role's row until the transaction ends: a newer leader's bump
-- (FOR UPDATE) waits for it, so every write in the transaction either commits before a newer
-- tenure exists or is refused. The transaction also commits synchronously and cannot idle for
-- longer than the lease. forge.fence raises SQLSTATE FG001 instead of answering false. Every
-- fenced statement uses one of the two.
--
-- It also takes a shared transaction-level advisory lock on (hashtext('forge.fence'),
-- hashtext('<namespace> <role>')): the fenced transactions in flight are visible in pg_locks
-- (forge.fenced_sessions), so a new leader whose bump waits for a stuck one can end it.
CREATE OR REPLACE FUNCTION forge.fence_holds(p_namespace text, p_role text, p_epoch bigint, p_tenure bigint)
RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    l forge.leaders%ROWTYPE;
BEGIN
    SELECT * INTO l FROM forge.leaders
     WHERE namespace = p_namespace AND role = p_role
       FOR KEY SHARE;
    IF NOT FOUND OR l.epoch <> p_epoch OR l.tenure <> p_tenure
       OR NOT forge.tenure_current(l) THEN
        RETURN false;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(hashtext('forge.fence'), hashtext(p_namespace || ' ' || p_role));
    PERFORM set_config('synchronous_commit', 'on', true);
    PERFORM set_config('idle_in_transaction_session_timeout', l.lease_ms::text, true);
    RETURN true;
END;
$$;
