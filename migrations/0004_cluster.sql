-- FORGE cluster model: the identity of a tenure and the one fence every leader-only write
-- uses, node membership (join, heartbeat, leave, drift, down, forget), one history of cluster
-- events that replaces forge.leader_events, and the built-in roles' duties on these tables
-- (cluster series, pruning).
--
-- Who writes what:
--   the lock session holding a role's key   forge.leaders row (campaign, renew, release)
--   a node's own node session               its forge.nodes row (join, heartbeat, leave)
--   the scheduler leader (fenced)           forge.nodes drift/down marks (forge.nodes_watch)
--   all of the above                        forge.events (in the same transactions)

-- A tenure is identified by (epoch, tenure): the epoch orders tenures, the random tenure id
-- tells two tenures apart even when a promoted asynchronous standby hands out an epoch a second
-- time (the bump that used it had not reached the standby). backend_start and backend_pid name
-- the lock session, so the fence can check that the session is alive on this very server.
ALTER TABLE forge.leaders
    ADD COLUMN tenure        bigint,
    ADD COLUMN backend_start timestamptz,
    ADD COLUMN lease_ms      bigint;
UPDATE forge.leaders
   SET tenure = (random() * 9e18)::bigint,
       backend_start = '-infinity',
       lease_ms = greatest(1000, (extract(epoch FROM lease_until - renewed_at) * 1000)::bigint);
ALTER TABLE forge.leaders
    ALTER COLUMN tenure SET NOT NULL,
    ALTER COLUMN backend_start SET NOT NULL,
    ALTER COLUMN lease_ms SET NOT NULL;

-- The cluster's history: leadership changes, membership changes (and, later, operator actions).
CREATE TABLE forge.events (
    id        bigserial   PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    namespace text        NOT NULL,
    kind      text        NOT NULL CHECK (kind IN (
                  'leader_elected', 'leader_released', 'leader_fenced', 'leader_lost',
                  'node_joined', 'node_left', 'node_drifted', 'node_recovered', 'node_down',
                  'node_rejoined', 'node_forgotten', 'admin_action')),
    node_id   text,
    role      text,
    epoch     bigint,
    detail    jsonb       NOT NULL DEFAULT '{}'
);

CREATE INDEX events_namespace_id ON forge.events (namespace, id);
CREATE INDEX events_role ON forge.events (namespace, role, id) WHERE role IS NOT NULL;
CREATE INDEX events_at ON forge.events (at);

COMMENT ON TABLE forge.events IS
    'Cluster history: leader_elected (detail.failover: the previous leader did not hand over; detail.gap_ms), leader_released (graceful handoff), leader_fenced (an expired holder was terminated), node_joined, node_left, node_drifted, node_recovered, node_down (detail.reason), node_rejoined, node_forgotten, admin_action (an operator''s write: detail.action, subject, by), leader_lost (a leader that lost its leadership without handing over, as it saw it: detail.reason).';

INSERT INTO forge.events (at, namespace, kind, node_id, role, epoch, detail)
SELECT at, namespace, 'leader_' || event, node_id, role, epoch, detail
  FROM forge.leader_events ORDER BY id;
DROP TABLE forge.leader_events;

-- The fence. forge.fence_holds answers whether (epoch, tenure) is the role's current,
-- unreleased, unexpired tenure and its lock session is alive on this server, and holds
-- FOR KEY SHARE on the role's row until the transaction ends: a newer leader's bump
-- (FOR UPDATE) waits for it, so every write in the transaction either commits before a newer
-- tenure exists or is refused. The transaction also commits synchronously and cannot idle for
-- longer than the lease. forge.fence raises SQLSTATE FG001 instead of answering false. Every
-- fenced statement uses one of the two.
CREATE FUNCTION forge.fence_holds(p_namespace text, p_role text, p_epoch bigint, p_tenure bigint)
RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    l forge.leaders%ROWTYPE;
BEGIN
    SELECT * INTO l FROM forge.leaders
     WHERE namespace = p_namespace AND role = p_role
       FOR KEY SHARE;
    IF NOT FOUND OR l.epoch <> p_epoch OR l.tenure <> p_tenure OR l.released_at IS NOT NULL
       OR l.lease_until <= clock_timestamp()
       -- A session of another database user shows no backend_start: count it alive.
       OR NOT EXISTS (SELECT 1 FROM pg_stat_get_activity(l.backend_pid) a
                       WHERE a.backend_start IS NULL OR a.backend_start = l.backend_start) THEN
        RETURN false;
    END IF;
    PERFORM set_config('synchronous_commit', 'on', true);
    PERFORM set_config('idle_in_transaction_session_timeout', l.lease_ms::text, true);
    RETURN true;
END;
$$;

CREATE FUNCTION forge.fence(p_namespace text, p_role text, p_epoch bigint, p_tenure bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    l forge.leaders%ROWTYPE;
BEGIN
    IF NOT forge.fence_holds(p_namespace, p_role, p_epoch, p_tenure) THEN
        SELECT * INTO l FROM forge.leaders WHERE namespace = p_namespace AND role = p_role;
        RAISE EXCEPTION USING
            ERRCODE = 'FG001',
            MESSAGE = format('fenced: role %s epoch %s is no longer the current leadership',
                             p_role, p_epoch),
            DETAIL = CASE
                WHEN l.role IS NULL THEN 'the role has no leadership record'
                WHEN l.epoch <> p_epoch OR l.tenure <> p_tenure
                    THEN format('the current leadership is epoch %s on node %s', l.epoch, l.node_id)
                WHEN l.released_at IS NOT NULL THEN 'the leadership was handed over'
                WHEN l.lease_until <= clock_timestamp() THEN 'the lease has expired'
                ELSE 'the lock session of the leadership is gone from this server' END;
    END IF;
END;
$$;

DROP FUNCTION forge.campaign(text, text, bigint, text, bigint, boolean);

-- Campaign for a role on the calling session (see 0001 for the shape). On acquisition the
-- epoch is bumped, a new tenure id drawn, the session identified (pid, backend_start), the
-- event recorded and a notification sent, in one round trip.
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
    tenure             bigint,
    backend_start      timestamptz,
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
    new_tenure bigint := (random() * 9e18)::bigint;
    my_start   timestamptz := (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) a);
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
               SET epoch = l.epoch + 1, tenure = new_tenure, lock_key = p_key, node_id = p_node,
                   backend_pid = pg_backend_pid(), backend_start = my_start, lease_ms = p_lease_ms,
                   acquired_at = at_time, renewed_at = at_time, lease_until = at_time + lease,
                   released_at = NULL
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
        INSERT INTO forge.events (at, namespace, kind, node_id, role, epoch, detail)
        VALUES (at_time, p_namespace, 'leader_elected', p_node, p_role, new_epoch,
                jsonb_build_object(
                    'previous_node', prev.node_id,
                    'previous_epoch', prev.epoch,
                    'failover', found_prev AND prev.released_at IS NULL,
                    'previous_lease_until', prev.lease_until,
                    'previous_released_at', prev.released_at,
                    -- The gap: from the previous leader's release (handoff) or last renewal
                    -- (failover) to this election.
                    'gap_ms', CASE WHEN found_prev THEN round(extract(epoch FROM
                        at_time - coalesce(prev.released_at, prev.renewed_at)) * 1000) END));
        PERFORM pg_notify('forge_leader', json_build_object(
            'namespace', p_namespace, 'role', p_role, 'epoch', new_epoch,
            'node', p_node, 'event', 'elected')::text);
        RETURN QUERY SELECT true, new_epoch, new_tenure, my_start, p_node, at_time, at_time + lease,
                            false, found_prev AND prev.released_at IS NULL, pg_backend_pid(),
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
            INSERT INTO forge.events (namespace, kind, node_id, role, epoch, detail)
            VALUES (p_namespace, 'leader_fenced', prev.node_id, p_role, prev.epoch,
                    jsonb_build_object('terminated_pid', h_pid, 'by_node', p_node,
                                       'lease_until', prev.lease_until));
        END IF;
    END IF;

    RETURN QUERY SELECT false, prev.epoch, NULL::bigint, NULL::timestamptz, prev.node_id,
                        prev.acquired_at, prev.lease_until, prev.released_at IS NOT NULL, false,
                        pg_backend_pid(), h_pid, h_app, fenced;
END;
$$;

DROP FUNCTION forge.release(text, text, bigint, bigint);

-- Graceful handoff: mark the lease released, record it, notify, and unlock, in one round trip.
-- The unlock takes effect at once; a waiting follower's epoch bump then waits for this
-- transaction's row lock, so it sees released_at set.
CREATE FUNCTION forge.release(
    p_namespace text,
    p_role      text,
    p_key       bigint,
    p_epoch     bigint,
    p_tenure    bigint
) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    at_time timestamptz := clock_timestamp();
    v_node  text;
BEGIN
    UPDATE forge.leaders l
       SET released_at = at_time, lease_until = at_time
     WHERE l.namespace = p_namespace AND l.role = p_role AND l.epoch = p_epoch
       AND l.tenure = p_tenure AND l.backend_pid = pg_backend_pid()
    RETURNING l.node_id INTO v_node;
    IF FOUND THEN
        INSERT INTO forge.events (at, namespace, kind, node_id, role, epoch, detail)
        VALUES (at_time, p_namespace, 'leader_released', v_node, p_role, p_epoch,
                jsonb_build_object('tenure_ms', round(extract(epoch FROM at_time - (
                    SELECT l.acquired_at FROM forge.leaders l
                     WHERE l.namespace = p_namespace AND l.role = p_role)) * 1000)));
        PERFORM pg_notify('forge_leader', json_build_object(
            'namespace', p_namespace, 'role', p_role, 'epoch', p_epoch,
            'event', 'released')::text);
    END IF;
    PERFORM pg_advisory_unlock(p_key);
    RETURN v_node IS NOT NULL;
END;
$$;

-- Membership. forge.nodes (created with the job queue in 0003) becomes the registry of every
-- node: identity, its node session, heartbeat, what it campaigns for and leads, and the marks
-- the scheduler leader sets when it has evidence the node is gone.
ALTER TABLE forge.nodes
    ADD COLUMN incarnation       bigint,
    ADD COLUMN hostname          text,
    ADD COLUMN pid               integer,
    ADD COLUMN version           text,
    ADD COLUMN roles             text[]      NOT NULL DEFAULT '{}',
    ADD COLUMN leads           text[]      NOT NULL DEFAULT '{}',
    ADD COLUMN admin_url         text,
    -- The node session: its backend, when it started, and the server process it is on.
    ADD COLUMN session_pid       integer,
    ADD COLUMN session_start     timestamptz,
    ADD COLUMN server_started_at timestamptz,
    -- Set by the scheduler leader.
    ADD COLUMN session_lost_at   timestamptz,
    ADD COLUMN drifted_at        timestamptz,
    ADD COLUMN down_at           timestamptz,
    ADD COLUMN down_reason       text,
    -- The node's counters, cumulative since it started ({"<series>|<label>": value}), sent with
    -- every heartbeat for the metrics_aggregator leader's rollups.
    ADD COLUMN tally             jsonb       NOT NULL DEFAULT '{}';

COMMENT ON TABLE forge.nodes IS
    'Cluster membership: every node registers (node_join), heartbeats on its node session, and records its stop. The scheduler leader marks drifted and down nodes (with evidence); the running jobs of down and stopped nodes are rescued.';

-- A node joins (first start) or rejoins (its node session reconnected) on its node session,
-- which already holds the node's advisory lock. Returns what the row said before.
CREATE FUNCTION forge.node_join(
    p_namespace   text,
    p_node        text,
    p_incarnation bigint,
    p_hostname    text,
    p_pid         integer,
    p_version     text,
    p_roles       text[],
    p_queues      jsonb,
    p_admin_url   text
) RETURNS TABLE (previous_incarnation bigint, previous_stopped boolean, was_down boolean,
                 server_now timestamptz)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    prev     forge.nodes%ROWTYPE;
    at_time  timestamptz := clock_timestamp();
    my_start timestamptz := (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) a);
    v_kind   text;
BEGIN
    SELECT * INTO prev FROM forge.nodes n
     WHERE n.namespace = p_namespace AND n.node_id = p_node FOR UPDATE;
    INSERT INTO forge.nodes AS n (namespace, node_id, started_at, heartbeat_at, queues, incarnation,
                                  hostname, pid, version, roles, admin_url, session_pid,
                                  session_start, server_started_at)
    VALUES (p_namespace, p_node, at_time, at_time, p_queues, p_incarnation, p_hostname, p_pid,
            p_version, p_roles, p_admin_url, pg_backend_pid(), my_start, pg_postmaster_start_time())
    ON CONFLICT (namespace, node_id) DO UPDATE
       SET started_at = CASE WHEN n.incarnation IS DISTINCT FROM p_incarnation
                             THEN at_time ELSE n.started_at END,
           heartbeat_at = at_time, stopped_at = NULL, queues = excluded.queues,
           incarnation = excluded.incarnation, hostname = excluded.hostname, pid = excluded.pid,
           version = excluded.version, roles = excluded.roles, admin_url = excluded.admin_url,
           session_pid = excluded.session_pid, session_start = excluded.session_start,
           server_started_at = excluded.server_started_at, session_lost_at = NULL,
           drifted_at = NULL, down_at = NULL, down_reason = NULL;
    v_kind := CASE
        WHEN prev.node_id IS NULL OR prev.incarnation IS DISTINCT FROM p_incarnation THEN 'node_joined'
        WHEN prev.down_at IS NOT NULL THEN 'node_rejoined'
        END;
    IF v_kind IS NOT NULL THEN
        INSERT INTO forge.events (at, namespace, kind, node_id, detail)
        VALUES (at_time, p_namespace, v_kind, p_node, jsonb_build_object(
            'hostname', p_hostname, 'pid', p_pid, 'version', p_version, 'roles', p_roles,
            'previous_incarnation_stopped', prev.stopped_at IS NOT NULL,
            'was_down', prev.down_at IS NOT NULL, 'down_reason', prev.down_reason));
    END IF;
    RETURN QUERY SELECT prev.incarnation, prev.stopped_at IS NOT NULL, prev.down_at IS NOT NULL,
                        at_time;
END;
$$;

-- A graceful stop, after the node's work has drained.
CREATE FUNCTION forge.node_leave(p_namespace text, p_node text, p_incarnation bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE forge.nodes n
       SET stopped_at = clock_timestamp(), heartbeat_at = clock_timestamp(), leads = '{}'
     WHERE n.namespace = p_namespace AND n.node_id = p_node AND n.incarnation = p_incarnation
       AND n.stopped_at IS NULL;
    IF FOUND THEN
        INSERT INTO forge.events (namespace, kind, node_id) VALUES (p_namespace, 'node_left', p_node);
    END IF;
END;
$$;

-- The scheduler leader's look at membership, fenced by its tenure. A node is marked
--   drifted  when it has not heartbeated for p_drift_ms;
--   down     when there is evidence it is gone:
--            * its node session ended while this server was up (a backend alive now is
--              older than the node's last heartbeat, on the same server process) and the node
--              did not rejoin within p_grace_ms; or
--            * it has not heartbeated for p_down_ms.
-- Ages are measured from the later of the heartbeat and the leader's lock session start: after
-- a PostgreSQL restart or a failover every node gets the full time to reconnect and heartbeat,
-- however long the outage was.
CREATE FUNCTION forge.nodes_watch(
    p_namespace text,
    p_role      text,
    p_epoch     bigint,
    p_tenure    bigint,
    p_drift_ms  bigint,
    p_down_ms   bigint,
    p_grace_ms  bigint
) RETURNS TABLE (node_id text, change text, reason text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_since  timestamptz;
    v_now    timestamptz := clock_timestamp();
    v_server timestamptz := pg_postmaster_start_time();
    n        record;
    v_alive  boolean;
    v_age    interval;
BEGIN
    PERFORM forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    SELECT l.backend_start INTO v_since FROM forge.leaders l
     WHERE l.namespace = p_namespace AND l.role = p_role;
    FOR n IN SELECT * FROM forge.nodes nd
              WHERE nd.namespace = p_namespace AND nd.stopped_at IS NULL AND nd.down_at IS NULL
              ORDER BY nd.node_id FOR UPDATE
    LOOP
        v_age := v_now - greatest(n.heartbeat_at, v_since);
        -- pg_stat_get_activity(NULL) would list every backend: a row without a session is
        -- not alive. A session of another database user shows no backend_start; count it alive.
        v_alive := n.session_pid IS NOT NULL
                   AND EXISTS (SELECT 1 FROM pg_stat_get_activity(n.session_pid) a
                                WHERE a.backend_start IS NULL OR a.backend_start = n.session_start);
        -- Gone while the server stayed up: some backend alive now started before the node's
        -- last heartbeat (a crash restart ends every backend), on the same server process (a
        -- promoted standby has another start time).
        IF NOT v_alive AND n.server_started_at = v_server
           AND EXISTS (SELECT 1 FROM pg_stat_get_activity(NULL) a
                        WHERE a.backend_start <= n.heartbeat_at) THEN
            IF n.session_lost_at IS NULL THEN
                UPDATE forge.nodes nd SET session_lost_at = v_now
                 WHERE nd.namespace = p_namespace AND nd.node_id = n.node_id;
                CONTINUE;
            ELSIF v_now - n.session_lost_at >= p_grace_ms * interval '1 millisecond' THEN
                UPDATE forge.nodes nd
                   SET down_at = v_now,
                       down_reason = 'its node session ended (process killed or crashed) and it did not reconnect'
                 WHERE nd.namespace = p_namespace AND nd.node_id = n.node_id;
                INSERT INTO forge.events (namespace, kind, node_id, detail)
                VALUES (p_namespace, 'node_down', n.node_id, jsonb_build_object(
                    'reason', 'session_ended', 'session_lost_at', n.session_lost_at,
                    'last_heartbeat', n.heartbeat_at, 'by_epoch', p_epoch));
                PERFORM pg_notify('forge_nodes', p_namespace || ' down ' || n.node_id);
                RETURN QUERY SELECT n.node_id, 'down'::text, 'session_ended'::text;
                CONTINUE;
            END IF;
        ELSIF v_alive AND n.session_lost_at IS NOT NULL THEN
            UPDATE forge.nodes nd SET session_lost_at = NULL
             WHERE nd.namespace = p_namespace AND nd.node_id = n.node_id;
        END IF;
        IF v_age >= p_down_ms * interval '1 millisecond' THEN
            UPDATE forge.nodes nd
               SET down_at = v_now,
                   down_reason = format('no heartbeat for %s', date_trunc('second', v_age))
             WHERE nd.namespace = p_namespace AND nd.node_id = n.node_id;
            INSERT INTO forge.events (namespace, kind, node_id, detail)
            VALUES (p_namespace, 'node_down', n.node_id, jsonb_build_object(
                'reason', 'no_heartbeat', 'last_heartbeat', n.heartbeat_at, 'by_epoch', p_epoch));
            PERFORM pg_notify('forge_nodes', p_namespace || ' down ' || n.node_id);
            RETURN QUERY SELECT n.node_id, 'down'::text, 'no_heartbeat'::text;
        ELSIF v_age >= p_drift_ms * interval '1 millisecond' AND n.drifted_at IS NULL THEN
            UPDATE forge.nodes nd SET drifted_at = v_now
             WHERE nd.namespace = p_namespace AND nd.node_id = n.node_id;
            INSERT INTO forge.events (namespace, kind, node_id, detail)
            VALUES (p_namespace, 'node_drifted', n.node_id, jsonb_build_object(
                'last_heartbeat', n.heartbeat_at));
            RETURN QUERY SELECT n.node_id, 'drifted'::text, 'no_heartbeat'::text;
        END IF;
    END LOOP;
END;
$$;

-- The built-in roles' duties on the core's tables:
--   metrics_aggregator leader  forge.stats (cluster series), forge.stats_cursor
--   log_compactor leader       prunes forge.events, forgets departed nodes, prunes forge.stats

-- A heartbeat, on the node session, with the node's cumulative counters. Returns false when
-- the row is not this incarnation's any more or the node was marked down (the node then
-- rejoins: its running jobs were rescued).
CREATE FUNCTION forge.node_heartbeat(
    p_namespace   text,
    p_node        text,
    p_incarnation bigint,
    p_leads       text[],
    p_tally       jsonb
) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    v_drifted timestamptz;
    v_down    timestamptz;
BEGIN
    SELECT n.drifted_at, n.down_at INTO v_drifted, v_down FROM forge.nodes n
     WHERE n.namespace = p_namespace AND n.node_id = p_node AND n.incarnation = p_incarnation
       AND n.session_pid = pg_backend_pid() AND n.stopped_at IS NULL
       FOR UPDATE;
    IF NOT FOUND OR v_down IS NOT NULL THEN
        RETURN false;
    END IF;
    UPDATE forge.nodes n
       SET heartbeat_at = clock_timestamp(), leads = p_leads, drifted_at = NULL,
           server_started_at = pg_postmaster_start_time(), tally = p_tally
     WHERE n.namespace = p_namespace AND n.node_id = p_node;
    IF v_drifted IS NOT NULL THEN
        INSERT INTO forge.events (namespace, kind, node_id, detail)
        VALUES (p_namespace, 'node_recovered', p_node,
                jsonb_build_object('drifted_at', v_drifted));
    END IF;
    RETURN true;
END;
$$;

-- Cluster series, one point per [metrics] rollup_interval starting at `at`: counters summed
-- over the nodes (differences between looks), and gauges sampled once per interval.
CREATE TABLE forge.stats (
    namespace text             NOT NULL,
    at        timestamptz      NOT NULL,
    series    text             NOT NULL,
    label     text             NOT NULL DEFAULT '',
    value     double precision NOT NULL,
    PRIMARY KEY (namespace, series, label, at)
);

CREATE INDEX stats_at ON forge.stats (namespace, at);

COMMENT ON TABLE forge.stats IS
    'Cluster series written by the metrics_aggregator leader, one point per [metrics] rollup_interval: job and cron counters summed over all nodes, queue depths; pruned by the log_compactor leader after [metrics] rollup_retention.';

-- The aggregator's last look at each node's counters.
CREATE TABLE forge.stats_cursor (
    namespace   text        NOT NULL,
    node_id     text        NOT NULL,
    incarnation bigint      NOT NULL,
    tally       jsonb       NOT NULL,
    at          timestamptz NOT NULL,
    PRIMARY KEY (namespace, node_id)
);

-- Rolls the nodes' counters into forge.stats for the interval that starts at p_at, fenced
-- by the aggregator's tenure. A node that restarted since the last look counts from zero; a
-- counter that went backwards (a restart the cursor missed) counts as its new value.
CREATE FUNCTION forge.stats_rollup(
    p_namespace text,
    p_role      text,
    p_epoch     bigint,
    p_tenure    bigint,
    p_at        timestamptz
) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_rows bigint;
BEGIN
    PERFORM forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    WITH now_seen AS (
        SELECT n.node_id, n.incarnation, n.tally FROM forge.nodes n
         WHERE n.namespace = p_namespace AND n.incarnation IS NOT NULL
    ), deltas AS (
        SELECT split_part(t.key, '|', 1) AS series, split_part(t.key, '|', 2) AS label,
               CASE WHEN c.incarnation IS DISTINCT FROM s.incarnation
                         OR (t.value)::double precision < coalesce((c.tally ->> t.key)::double precision, 0)
                    THEN (t.value)::double precision
                    ELSE (t.value)::double precision - coalesce((c.tally ->> t.key)::double precision, 0)
               END AS delta
          FROM now_seen s
          CROSS JOIN LATERAL jsonb_each(s.tally) t
          LEFT JOIN forge.stats_cursor c ON c.namespace = p_namespace AND c.node_id = s.node_id
    ), ins AS (
        INSERT INTO forge.stats AS st (namespace, at, series, label, value)
        SELECT p_namespace, p_at, d.series, d.label, sum(d.delta)
          FROM deltas d GROUP BY d.series, d.label
        ON CONFLICT (namespace, series, label, at)
           DO UPDATE SET value = st.value + EXCLUDED.value
        RETURNING 1
    )
    SELECT count(*) INTO v_rows FROM ins;
    INSERT INTO forge.stats_cursor AS c (namespace, node_id, incarnation, tally, at)
    SELECT p_namespace, n.node_id, n.incarnation, n.tally, clock_timestamp()
      FROM forge.nodes n WHERE n.namespace = p_namespace AND n.incarnation IS NOT NULL
    ON CONFLICT (namespace, node_id) DO UPDATE
       SET incarnation = EXCLUDED.incarnation, tally = EXCLUDED.tally, at = EXCLUDED.at;
    RETURN v_rows;
END;
$$;

-- Writes gauge samples (series, label, value) for an interval, fenced.
CREATE FUNCTION forge.stats_sample(
    p_namespace text,
    p_role      text,
    p_epoch     bigint,
    p_tenure    bigint,
    p_at        timestamptz,
    p_series    text[],
    p_labels    text[],
    p_values    double precision[]
) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    INSERT INTO forge.stats AS st (namespace, at, series, label, value)
    SELECT p_namespace, p_at, s.series, s.label, s.value
      FROM unnest(p_series, p_labels, p_values) AS s(series, label, value)
    ON CONFLICT (namespace, series, label, at) DO UPDATE SET value = EXCLUDED.value;
END;
$$;

-- The log compactor's pruners: each deletes at most p_limit rows older than its retention,
-- fenced by the compactor's tenure, and returns how many it deleted.

CREATE FUNCTION forge.prune_events(
    p_namespace text, p_role text, p_epoch bigint, p_tenure bigint,
    p_retention_ms bigint, p_limit integer
) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_count bigint;
BEGIN
    PERFORM forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    WITH d AS (
        DELETE FROM forge.events e
         WHERE e.id IN (SELECT x.id FROM forge.events x
                         WHERE x.namespace = p_namespace
                           AND x.at < clock_timestamp() - p_retention_ms * interval '1 millisecond'
                         ORDER BY x.id LIMIT p_limit)
        RETURNING 1
    ) SELECT count(*) INTO v_count FROM d;
    RETURN v_count;
END;
$$;

-- Forgets nodes that stopped or went down longer than the retention ago (and their counter
-- cursors), recording node_forgotten.
CREATE FUNCTION forge.prune_nodes(
    p_namespace text, p_role text, p_epoch bigint, p_tenure bigint,
    p_retention_ms bigint, p_limit integer
) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_count bigint;
BEGIN
    PERFORM forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    WITH d AS (
        DELETE FROM forge.nodes n
         WHERE n.namespace = p_namespace
           AND n.node_id IN (SELECT x.node_id FROM forge.nodes x
                              WHERE x.namespace = p_namespace
                                AND coalesce(x.stopped_at, x.down_at)
                                    < clock_timestamp() - p_retention_ms * interval '1 millisecond'
                              LIMIT p_limit)
        RETURNING n.node_id, n.stopped_at, n.down_at, n.down_reason
    ), e AS (
        INSERT INTO forge.events (namespace, kind, node_id, detail)
        SELECT p_namespace, 'node_forgotten', d.node_id,
               jsonb_build_object('stopped_at', d.stopped_at, 'down_at', d.down_at,
                                  'down_reason', d.down_reason)
          FROM d
        RETURNING node_id
    ), c AS (
        DELETE FROM forge.stats_cursor sc
         WHERE sc.namespace = p_namespace AND sc.node_id IN (SELECT node_id FROM e)
    )
    SELECT count(*) INTO v_count FROM e;
    RETURN v_count;
END;
$$;

CREATE FUNCTION forge.prune_stats(
    p_namespace text, p_role text, p_epoch bigint, p_tenure bigint,
    p_retention_ms bigint, p_limit integer
) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_count bigint;
BEGIN
    PERFORM forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    WITH d AS (
        DELETE FROM forge.stats s
         WHERE (s.namespace, s.series, s.label, s.at) IN (
               SELECT x.namespace, x.series, x.label, x.at FROM forge.stats x
                WHERE x.namespace = p_namespace
                  AND x.at < clock_timestamp() - p_retention_ms * interval '1 millisecond'
                LIMIT p_limit)
        RETURNING 1
    ) SELECT count(*) INTO v_count FROM d;
    RETURN v_count;
END;
$$;

-- The audit trail: an operator's write (through the admin API or the CLI), recorded in the
-- events history in the transaction of the write itself.
CREATE FUNCTION forge.audit(
    p_namespace text, p_action text, p_subject text, p_by text, p_detail jsonb
) RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO forge.events (namespace, kind, detail)
    VALUES (p_namespace, 'admin_action',
            jsonb_build_object('action', p_action, 'subject', p_subject, 'by', p_by)
              || coalesce(p_detail, '{}'::jsonb));
$$;

-- Asks the current leader of a role to hand over gracefully (any node, or a process that is
-- no node, may ask: the request travels as a notice on forge_leader, which every node hears).
-- Returns the epoch asked to step down; NULL when the role has no live leader.
CREATE FUNCTION forge.step_down(p_namespace text, p_role text, p_by text) RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_epoch bigint;
    v_node  text;
BEGIN
    SELECT l.epoch, l.node_id INTO v_epoch, v_node FROM forge.leaders l
     WHERE l.namespace = p_namespace AND l.role = p_role AND l.released_at IS NULL
       AND l.lease_until > clock_timestamp();
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM forge.audit(p_namespace, 'step_down', p_role, p_by,
                        jsonb_build_object('epoch', v_epoch, 'node_id', v_node));
    PERFORM pg_notify('forge_leader', json_build_object(
        'namespace', p_namespace, 'role', p_role, 'epoch', v_epoch,
        'node', v_node, 'event', 'step_down')::text);
    RETURN v_epoch;
END;
$$;

-- A leader that lost its leadership without handing over says so (best effort, once it can):
-- detail.reason is what it saw (deadline, deposed, renewal_failed).
CREATE FUNCTION forge.leader_lost(
    p_namespace text, p_role text, p_node text, p_epoch bigint, p_tenure bigint, p_reason text
) RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO forge.events (namespace, kind, node_id, role, epoch, detail)
    VALUES (p_namespace, 'leader_lost', p_node, p_role, p_epoch,
            jsonb_build_object('reason', p_reason, 'tenure', p_tenure));
$$;
