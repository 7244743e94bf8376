-- FORGE leader election: one row per (namespace, role), a history of transitions, and the two
-- functions that campaign for and release a role in one round trip each.
--
-- forge.leaders is a logged table on purpose: an epoch, once handed out, is durable, so epochs
-- never go backwards, even across a PostgreSQL crash.

CREATE TABLE forge.leaders (
    namespace    text        NOT NULL,
    role         text        NOT NULL,
    lock_key     bigint      NOT NULL,
    epoch        bigint      NOT NULL CHECK (epoch > 0),
    node_id      text        NOT NULL,
    backend_pid  integer     NOT NULL,
    acquired_at  timestamptz NOT NULL,
    renewed_at   timestamptz NOT NULL,
    lease_until  timestamptz NOT NULL,
    released_at  timestamptz,
    PRIMARY KEY (namespace, role),
    CONSTRAINT leaders_lock_key_unique UNIQUE (lock_key)
);

COMMENT ON TABLE forge.leaders IS
    'Current leadership of each FORGE role. epoch is the fencing token: leader-only writes check it.';

CREATE TABLE forge.leader_events (
    id         bigserial   PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    namespace  text        NOT NULL,
    role       text        NOT NULL,
    epoch      bigint      NOT NULL,
    node_id    text        NOT NULL,
    event      text        NOT NULL CHECK (event IN ('elected', 'released', 'fenced')),
    detail     jsonb       NOT NULL DEFAULT '{}'
);

CREATE INDEX leader_events_role_at ON forge.leader_events (namespace, role, at);

COMMENT ON TABLE forge.leader_events IS
    'Leadership history: elected (with failover = previous leader did not release), released (graceful handoff), fenced (an expired holder was terminated).';

-- Campaign for a role on the calling session.
--
-- p_wait = false tries the lock once; p_wait = true waits inside pg_advisory_lock, bounded by the
-- session's lock_timeout. On acquisition the role's epoch is bumped in the same transaction and a
-- notification goes out on channel forge_leader. When the wait times out, the function reports
-- who holds the key, and terminates the holder if it is the recorded FORGE leader and its lease
-- has expired (the fallback for when idle_session_timeout did not end a frozen leader).
--
-- Any error after the lock was granted leaves the session-level lock held: the caller must then
-- close the session.
CREATE FUNCTION forge.campaign(
    p_namespace text,
    p_role      text,
    p_key       bigint,
    p_node      text,
    p_lease_ms  bigint,
    p_wait      boolean
) RETURNS TABLE (
    acquired           boolean,
    epoch              bigint,
    leader_node        text,
    leader_since       timestamptz,
    lease_until        timestamptz,
    released           boolean,
    failover           boolean,
    my_pid             integer,
    holder_pid         integer,
    holder_application text,
    fenced_pid         integer
)
LANGUAGE plpgsql
AS $$
DECLARE
    got        boolean;
    found_prev boolean;
    prev       forge.leaders%ROWTYPE;
    new_epoch  bigint;
    at_time    timestamptz;
    lease      interval := make_interval(secs => p_lease_ms / 1000.0);
    h_pid      integer;
    h_app      text;
    fenced     integer;
BEGIN
    IF p_wait THEN
        BEGIN
            PERFORM pg_advisory_lock(p_key);
            got := true;
        EXCEPTION WHEN lock_not_available THEN
            got := false;
        END;
    ELSE
        got := pg_try_advisory_lock(p_key);
    END IF;

    IF got THEN
        -- FOR UPDATE waits for deposed leaders' fenced transactions (FOR KEY SHARE) to finish.
        SELECT * INTO prev FROM forge.leaders l
         WHERE l.namespace = p_namespace AND l.role = p_role
           FOR UPDATE;
        found_prev := FOUND;
        at_time := clock_timestamp();
        IF found_prev THEN
            UPDATE forge.leaders l
               SET epoch = l.epoch + 1, lock_key = p_key, node_id = p_node,
                   backend_pid = pg_backend_pid(), acquired_at = at_time, renewed_at = at_time,
                   lease_until = at_time + lease, released_at = NULL
             WHERE l.namespace = p_namespace AND l.role = p_role
            RETURNING l.epoch INTO new_epoch;
        ELSE
            INSERT INTO forge.leaders AS l (namespace, role, lock_key, epoch, node_id, backend_pid,
                                            acquired_at, renewed_at, lease_until)
            VALUES (p_namespace, p_role, p_key, 1, p_node, pg_backend_pid(),
                    at_time, at_time, at_time + lease)
            RETURNING l.epoch INTO new_epoch;
        END IF;
        INSERT INTO forge.leader_events (at, namespace, role, epoch, node_id, event, detail)
        VALUES (at_time, p_namespace, p_role, new_epoch, p_node, 'elected',
                jsonb_build_object(
                    'previous_node', prev.node_id,
                    'previous_epoch', prev.epoch,
                    'failover', found_prev AND prev.released_at IS NULL,
                    'previous_lease_until', prev.lease_until));
        PERFORM pg_notify('forge_leader', json_build_object(
            'namespace', p_namespace, 'role', p_role, 'epoch', new_epoch,
            'node', p_node, 'event', 'elected')::text);
        RETURN QUERY SELECT true, new_epoch, p_node, at_time, at_time + lease, false,
                            found_prev AND prev.released_at IS NULL, pg_backend_pid(),
                            NULL::integer, NULL::text, NULL::integer;
        RETURN;
    END IF;

    -- Not granted: report the current leadership and the key's holder.
    SELECT lk.pid, a.application_name INTO h_pid, h_app
      FROM pg_locks lk
      LEFT JOIN pg_stat_activity a ON a.pid = lk.pid
     WHERE lk.locktype = 'advisory' AND lk.granted
       AND lk.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
       AND lk.classid = ((p_key >> 32) & 4294967295)::oid
       AND lk.objid = (p_key & 4294967295)::oid
       AND lk.objsubid = 1
     LIMIT 1;

    SELECT * INTO prev FROM forge.leaders l WHERE l.namespace = p_namespace AND l.role = p_role;
    found_prev := FOUND;

    IF found_prev AND h_pid IS NOT NULL AND prev.backend_pid = h_pid
       AND prev.released_at IS NULL AND prev.lease_until < clock_timestamp() THEN
        -- The recorded leader holds the key past its lease: it is frozen or cut off. It has
        -- already stopped trusting its leadership (its local deadline ends before the lease),
        -- so ending its session is safe.
        IF pg_terminate_backend(h_pid) THEN
            fenced := h_pid;
            INSERT INTO forge.leader_events (namespace, role, epoch, node_id, event, detail)
            VALUES (p_namespace, p_role, prev.epoch, prev.node_id, 'fenced',
                    jsonb_build_object('terminated_pid', h_pid, 'by_node', p_node,
                                       'lease_until', prev.lease_until));
        END IF;
    END IF;

    RETURN QUERY SELECT false, prev.epoch, prev.node_id, prev.acquired_at, prev.lease_until,
                        prev.released_at IS NOT NULL, false, pg_backend_pid(),
                        h_pid, h_app, fenced;
END;
$$;

-- Graceful handoff: mark the lease released, record it, notify, and unlock, in one round trip.
-- The unlock takes effect at once; a waiting follower's epoch bump then waits for this
-- transaction's row lock, so it sees released_at set.
CREATE FUNCTION forge.release(
    p_namespace text,
    p_role      text,
    p_key       bigint,
    p_epoch     bigint
) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    at_time timestamptz := clock_timestamp();
    was_leader boolean;
BEGIN
    UPDATE forge.leaders l
       SET released_at = at_time, lease_until = at_time
     WHERE l.namespace = p_namespace AND l.role = p_role AND l.epoch = p_epoch
       AND l.backend_pid = pg_backend_pid();
    was_leader := FOUND;
    IF was_leader THEN
        INSERT INTO forge.leader_events (at, namespace, role, epoch, node_id, event)
        SELECT at_time, p_namespace, p_role, p_epoch, l.node_id, 'released'
          FROM forge.leaders l WHERE l.namespace = p_namespace AND l.role = p_role;
        PERFORM pg_notify('forge_leader', json_build_object(
            'namespace', p_namespace, 'role', p_role, 'epoch', p_epoch,
            'event', 'released')::text);
    END IF;
    PERFORM pg_advisory_unlock(p_key);
    RETURN was_leader;
END;
$$;
