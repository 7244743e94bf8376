-- Campaign for a role on the calling session, in one round trip.
--
-- A first try takes a free lock without waiting. Then, with p_wait, the session waits inside
-- pg_advisory_lock (bounded by its lock_timeout) - unless p_standbys sessions wait for the key
-- already (NULL: no limit): this follower is then a reserve (reserve = true), waits outside the
-- lock, and its node closes the session; reserves learn from forge.standbys_wanted, through
-- their node session's heartbeat, when to campaign again. Failover is unaffected: a standby is
-- granted the lock the instant the leader's session ends.
--
-- On acquisition, in the same transaction: the epoch is bumped, a new random tenure id drawn
-- (the epoch orders tenures; the tenure id tells apart two tenures given the same epoch by a
-- promoted asynchronous standby that missed the bump), the lock session identified
-- (backend_pid, backend_start: the fence checks it is alive on this server), leader_elected
-- recorded (with failover, gap_ms and gap_from) and a notification sent on channel
-- forge_leader.
--
-- Not granted: the function reports the current leadership (with its renewal, renewed_at) and who
-- holds the key. A follower that has seen that renewal unchanged for a lease on its own monotonic
-- clock names the tenure and the renewal it saw (p_end_*; such a call does not wait): the holder
-- is terminated if it is still that tenure's lock session and no renewal landed since (the row
-- is locked against one meanwhile). That leader has stopped trusting itself by then: it trusts
-- its lease until a renewal's send time + lease - margin, on its own monotonic clock, and the
-- follower saw that renewal after it was sent. No wall clock decides it: the fallback for when
-- the server did not end a frozen leader (idle_session_timeout is a deadline on the server's
-- wall clock, so a step of that clock moves it; PostgreSQL 13 has none).
--
-- A waiter granted the lock of a role whose graceful handoff named another node (a placement
-- move, until handoff_until) passes the lock on instead: the named node takes it.
--
-- Lock waits are bounded by the session's lock_timeout, a deadline on the server's wall clock
-- (PostgreSQL's timers are), which a step of that clock can make late: the caller then cuts the
-- wait short (pg_cancel_backend, by its own clock), and a cancelled wait counts as a timed-out
-- one.
--
-- Any error after the lock was granted leaves the session-level lock held: the caller must then
-- close the session, or unlock (pg_advisory_unlock_all) before it campaigns again on it.
--
-- The bump's FOR UPDATE waits for deposed tenures' fenced transactions (FOR KEY SHARE). One
-- still open after lock_timeout that is idle (its process frozen or paused inside it), or seen
-- open, the same transaction, through waits adding up to a lease (stuck), has its session ended
-- (forge.fenced_sessions finds them) and a leader_fenced event records it: a frozen leader is
-- replaced within its lease whatever transactions it left open. Safe: such a transaction
-- commits before the new tenure or not at all, and now it does not. A busy one not yet seen
-- through a lease of waits (a commit in progress) is waited for.

DROP FUNCTION IF EXISTS forge.campaign(text, text, bigint, text, bigint, boolean, integer);
CREATE OR REPLACE FUNCTION forge.campaign(
    p_namespace    text,
    p_role         text,
    p_key          bigint,
    p_node         text,
    p_lease_ms     bigint,
    p_wait         boolean,
    p_standbys     integer,
    p_end_epoch    bigint,
    p_end_tenure   bigint,
    p_end_renewed  timestamptz,
    p_silent_ms    bigint
) RETURNS TABLE (
    acquired           boolean,
    epoch              bigint,
    tenure             bigint,
    backend_start      timestamptz,
    leader_node        text,
    leader_since       timestamptz,
    lease_until        timestamptz,
    renewed_at         timestamptz,
    released           boolean,
    failover           boolean,
    my_pid             integer,
    holder_pid         integer,
    holder_application text,
    fenced_pid         integer,
    reserve            boolean
)
LANGUAGE plpgsql
AS $$
DECLARE
    got         boolean;
    found_prev  boolean;
    prev        forge.leaders%ROWTYPE;
    new_epoch   bigint;
    new_tenure  bigint := (random() * 9e18)::bigint;
    my_start    timestamptz := (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) a);
    at_time     timestamptz;
    lease       interval := make_interval(secs => p_lease_ms / 1000.0);
    h_pid       integer;
    h_app       text;
    fenced      integer;
    stand_by    boolean := p_wait;
    ended       integer[];
    tries       integer := 0;
    lease_waits integer := ceil(p_lease_ms / greatest(1000 * extract(epoch FROM
                                current_setting('lock_timeout')::interval), 1));
    stuck_pids  integer[] := '{}';
    stuck_since timestamptz[] := '{}';
    granted_at  timestamptz;
    waited      boolean := false;
    gap_from    text;
BEGIN
    got := pg_try_advisory_lock(p_key);
    IF got THEN
        granted_at := clock_timestamp();
    END IF;
    IF NOT got AND p_wait AND p_standbys IS NOT NULL
       AND forge.lock_waiters(p_key) >= p_standbys THEN
        -- Enough followers wait inside the lock already: this one waits outside it.
        stand_by := false;
    END IF;
    IF NOT got AND stand_by THEN
        BEGIN
            PERFORM pg_advisory_lock(p_key);
            got := true;
            -- Granted while waiting: the holder's lock session ended (or it unlocked) now.
            granted_at := clock_timestamp();
            waited := true;
        EXCEPTION WHEN lock_not_available OR query_canceled THEN
            got := false;
        END;
    END IF;

    IF got THEN
        -- FOR UPDATE waits for deposed leaders' fenced transactions (FOR KEY SHARE) to finish.
        -- One still open after lock_timeout that is idle (its process frozen or paused inside
        -- it), or the same transaction still open after waits adding up to a lease (stuck on
        -- something else), will not finish soon: its session is ended and the bump goes ahead,
        -- rather than leaving the role without a leader until the transaction ends by itself.
        -- Ending it is safe: it was going to commit before the new tenure or not at all, and
        -- now it does not. A busy one not yet seen through a lease of waits (a commit in
        -- progress) is waited for. Fenced transactions are found by the shared advisory lock
        -- forge.fence_holds takes. (The waits count, not the transactions' xact_start against
        -- this server's clock: a step of that clock would make every one look stuck.)
        LOOP
            BEGIN
                SELECT * INTO prev FROM forge.leaders l
                 WHERE l.namespace = p_namespace AND l.role = p_role
                   FOR UPDATE;
                found_prev := FOUND;
                EXIT;
            EXCEPTION WHEN lock_not_available OR query_canceled THEN
                tries := tries + 1;
                -- (Up to two leases of waits: by then every transaction of the earlier tenure
                -- has been seen through a lease of them, and so ended.)
                IF tries > 2 + 2 * lease_waits THEN
                    RAISE;
                END IF;
                -- (The sessions first, then the terminations: a function call in a WHERE
                -- clause may run before the other conditions, on every row.)
                SELECT coalesce(array_agg(s.pid), '{}') INTO ended
                  FROM forge.fenced_sessions(p_namespace, p_role) s
                 WHERE s.pid <> pg_backend_pid()
                   AND (s.state LIKE 'idle in transaction%' OR s.state IS NULL
                        OR (tries > lease_waits
                            AND (s.pid, s.xact_start) IN (SELECT * FROM unnest(stuck_pids, stuck_since))));
                IF tries = 1 THEN
                    -- The transactions open at the first wait: those still open, the same
                    -- ones, after a lease of waits are stuck.
                    SELECT coalesce(array_agg(s.pid), '{}'), coalesce(array_agg(s.xact_start), '{}')
                      INTO stuck_pids, stuck_since
                      FROM forge.fenced_sessions(p_namespace, p_role) s
                     WHERE s.pid <> pg_backend_pid() AND NOT (s.pid = ANY (ended));
                END IF;
                PERFORM pg_terminate_backend(e, 1000) FROM unnest(ended) AS e;
                IF cardinality(ended) > 0 THEN
                    INSERT INTO forge.events (namespace, kind, node_id, role, detail)
                    VALUES (p_namespace, 'leader_fenced', p_node, p_role,
                            jsonb_build_object('terminated_pids', ended, 'by_node', p_node,
                                               'why', 'fenced transactions of an earlier tenure held the role''s row past lock_timeout'));
                END IF;
            END;
        END LOOP;
        IF found_prev AND prev.handoff_to IS NOT NULL AND prev.handoff_to <> p_node
           AND prev.handoff_until > clock_timestamp() THEN
            -- A placement move handed the role to another node, waiting behind this one: pass
            -- the lock on (this node waits again, behind it). Reported as not granted.
            PERFORM pg_advisory_unlock(p_key);
            RETURN QUERY SELECT false, prev.epoch, NULL::bigint, NULL::timestamptz, prev.node_id,
                                prev.acquired_at, prev.lease_until, prev.renewed_at, true, false,
                                pg_backend_pid(), NULL::integer, NULL::text, NULL::integer, false;
            RETURN;
        END IF;
        at_time := clock_timestamp();
        IF found_prev THEN
            UPDATE forge.leaders l
               SET epoch = l.epoch + 1, tenure = new_tenure, lock_key = p_key, node_id = p_node,
                   backend_pid = pg_backend_pid(), backend_start = my_start, lease_ms = p_lease_ms,
                   acquired_at = at_time, renewed_at = at_time, lease_until = at_time + lease,
                   released_at = NULL, handoff_to = NULL, handoff_until = NULL,
                   moved_at = CASE WHEN prev.handoff_to = p_node
                                    AND prev.handoff_until > at_time THEN at_time END
             WHERE l.namespace = p_namespace AND l.role = p_role
            RETURNING l.epoch INTO new_epoch;
        ELSE
            INSERT INTO forge.leaders AS l (namespace, role, lock_key, epoch, tenure, node_id,
                                            backend_pid, backend_start, lease_ms, acquired_at,
                                            renewed_at, lease_until)
            VALUES (p_namespace, p_role, p_key, 1, new_tenure, p_node, pg_backend_pid(), my_start,
                    p_lease_ms, at_time, at_time, at_time + lease)
            RETURNING l.epoch INTO new_epoch;
        END IF;
        -- The gap: how long the role was without a leader, from the last instant the previous
        -- tenure is known to have led (gap_from) to this election. A handoff: its release. A
        -- failover whose new leader waited inside the lock while the previous lease was still
        -- valid: the grant, which is the instant the previous lock session ended (a crash, a
        -- terminated session) - the takeover itself. Any other failover (the lock was free when
        -- asked, so the session ended at some unknown earlier instant; or the previous lease had
        -- run out: a frozen or cut-off leader stopped leading before): the previous leader's
        -- last renewal, an upper bound. (A report, on this server's clock, which a step of that
        -- clock distorts; nothing is decided by it.)
        IF found_prev THEN
            gap_from := CASE
                WHEN prev.released_at IS NOT NULL THEN 'release'
                WHEN waited AND prev.lease_until >= granted_at THEN 'lock_granted'
                ELSE 'last_renewal' END;
        END IF;
        INSERT INTO forge.events (at, namespace, kind, node_id, role, epoch, detail)
        VALUES (at_time, p_namespace, 'leader_elected', p_node, p_role, new_epoch,
                jsonb_build_object(
                    'previous_node', prev.node_id,
                    'previous_epoch', prev.epoch,
                    'failover', found_prev AND prev.released_at IS NULL,
                    'previous_lease_until', prev.lease_until,
                    'previous_released_at', prev.released_at,
                    'moved', found_prev AND prev.handoff_to IS NOT DISTINCT FROM p_node,
                    'gap_from', gap_from,
                    'gap_ms', round((extract(epoch FROM at_time - CASE gap_from
                        WHEN 'release' THEN prev.released_at
                        WHEN 'lock_granted' THEN granted_at
                        ELSE prev.renewed_at END) * 1000)::numeric, 3)));
        PERFORM pg_notify('forge_leader', json_build_object(
            'namespace', p_namespace, 'role', p_role, 'epoch', new_epoch,
            'node', p_node, 'event', 'elected')::text);
        -- The leader's duties run on this session between renewals (Leadership::session):
        -- bound each statement and lock wait to a sixth of the lease, so that none delays a
        -- renewal past the leader's deadline. (This session waits for no lock any more.)
        PERFORM set_config('statement_timeout', greatest(p_lease_ms / 6, 100)::text, false);
        PERFORM set_config('lock_timeout', greatest(p_lease_ms / 6, 100)::text, false);
        RETURN QUERY SELECT true, new_epoch, new_tenure, my_start, p_node, at_time, at_time + lease,
                            at_time, false, found_prev AND prev.released_at IS NULL,
                            pg_backend_pid(), NULL::integer, NULL::text, NULL::integer, false;
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

    IF p_end_tenure IS NOT NULL AND found_prev AND h_pid IS NOT NULL
       AND prev.backend_pid = h_pid AND prev.released_at IS NULL
       AND prev.epoch = p_end_epoch AND prev.tenure = p_end_tenure
       AND prev.renewed_at = p_end_renewed THEN
        -- The caller saw this renewal unchanged for a lease: the holder is frozen or cut off,
        -- and has stopped trusting its leadership. The row is locked first, so that a renewal
        -- either landed before (renewed_at moved: nothing is ended) or comes after and finds
        -- its session ended. (A row held past lock_timeout by a renewal or a bump: not silent.)
        BEGIN
            SELECT * INTO prev FROM forge.leaders l
             WHERE l.namespace = p_namespace AND l.role = p_role
               FOR NO KEY UPDATE;
            IF prev.backend_pid = h_pid AND prev.released_at IS NULL
               AND prev.epoch = p_end_epoch AND prev.tenure = p_end_tenure
               AND prev.renewed_at = p_end_renewed
               AND EXISTS (SELECT 1 FROM pg_stat_get_activity(h_pid) a
                            WHERE a.backend_start IS NULL OR a.backend_start = prev.backend_start) THEN
                IF pg_terminate_backend(h_pid) THEN
                    fenced := h_pid;
                    INSERT INTO forge.events (namespace, kind, node_id, role, epoch, detail)
                    VALUES (p_namespace, 'leader_fenced', prev.node_id, p_role, prev.epoch,
                            jsonb_build_object('terminated_pid', h_pid, 'by_node', p_node,
                                               'renewed_at', prev.renewed_at,
                                               'silent_ms', p_silent_ms,
                                               'why', 'no renewal seen for a lease'));
                END IF;
            END IF;
        EXCEPTION WHEN lock_not_available OR query_canceled THEN
            NULL;
        END;
    END IF;

    RETURN QUERY SELECT false, prev.epoch, prev.tenure, NULL::timestamptz, prev.node_id,
                        prev.acquired_at, prev.lease_until, prev.renewed_at,
                        prev.released_at IS NOT NULL, false, pg_backend_pid(), h_pid, h_app, fenced,
                        p_wait AND NOT stand_by;
END;
$$;
