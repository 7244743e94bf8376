-- Takes a worker's lane for incarnation p_incarnation and returns the lane's new generation:
-- the identity its next claims carry (forge.jobs_step claims only with the lane's current
-- incarnation and generation). A lane is a queue, or '@' || role for a role's worker. Called by
-- the worker's reconciliation (forge.jobs_reconcile) and by a new incarnation of a node for its
-- predecessor's lanes (forge.jobs_rescue_own), in their transaction, before they look at the
-- lane's jobs.
--
-- Every round trip of the lane holds the lane lock shared until its transaction ends
-- (forge.jobs_step). This takes it exclusively, waiting at most p_wait_ms at a time, and ends
-- the sessions that still hold it after two waits (round trips their worker gave up on: a claim
-- whose commit waits for a stalled synchronous standby, say; a claim of a process that died).
-- Then it advances the generation, under that lock, in the caller's transaction: a round trip
-- that held the lock has committed (its claims are seen by the caller's look) or was ended; one
-- that takes the lock after the caller commits sees the new generation and claims nothing.
CREATE OR REPLACE FUNCTION forge.jobs_lane_take(
    p_namespace   text,
    p_node        text,
    p_lane        text,
    p_incarnation bigint,
    p_wait_ms     integer
) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_key        integer := hashtext(p_namespace || ' ' || p_node || ' ' || p_lane);
    v_timeout    text := current_setting('lock_timeout');
    v_tries      integer := 0;
    v_stale      integer[];
    v_generation bigint;
BEGIN
    PERFORM set_config('lock_timeout', greatest(p_wait_ms, 1)::text, true);
    LOOP
        BEGIN
            PERFORM pg_advisory_xact_lock(hashtext('forge.jobs_worker'), v_key);
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            v_tries := v_tries + 1;
            IF v_tries > 2 THEN
                RAISE;
            END IF;
            SELECT coalesce(array_agg(lk.pid), '{}') INTO v_stale FROM pg_locks lk
             WHERE lk.locktype = 'advisory' AND lk.objsubid = 2 AND lk.pid <> pg_backend_pid()
               AND lk.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
               AND lk.classid = hashtext('forge.jobs_worker')::oid AND lk.objid = v_key::oid;
            PERFORM pg_terminate_backend(x, 1000) FROM unnest(v_stale) AS x;
        END;
    END LOOP;
    PERFORM set_config('lock_timeout', v_timeout, true);

    INSERT INTO forge.job_lanes AS l (namespace, node_id, lane, incarnation, generation, taken_at)
    VALUES (p_namespace, p_node, p_lane, p_incarnation, nextval('forge.job_lane_generations'),
            clock_timestamp())
    ON CONFLICT (namespace, node_id, lane) DO UPDATE
       SET incarnation = excluded.incarnation, generation = excluded.generation,
           taken_at = excluded.taken_at
    RETURNING l.generation INTO v_generation;
    RETURN v_generation;
END;
$$;
