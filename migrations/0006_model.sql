-- FORGE cluster model, part 2: the built-in roles' duties on the core's tables.
--
--   metrics_aggregator leader  forge.stats (cluster series), forge.stats_cursor
--   log_compactor leader       prunes forge.events, forgets departed nodes, prunes forge.stats
--
-- Nodes publish their counters in their heartbeat (forge.nodes.tally: cumulative since the
-- node started, {"<series>|<label>": value}); the aggregator turns the differences between
-- two looks into one row per series and [metrics] rollup_interval (a minute by default).

ALTER TABLE forge.nodes ADD COLUMN tally jsonb NOT NULL DEFAULT '{}';

ALTER TABLE forge.events DROP CONSTRAINT events_kind_check;
ALTER TABLE forge.events ADD CONSTRAINT events_kind_check CHECK (kind IN (
    'leader_elected', 'leader_released', 'leader_fenced',
    'node_joined', 'node_left', 'node_drifted', 'node_recovered', 'node_down',
    'node_rejoined', 'node_forgotten'));

DROP FUNCTION forge.node_heartbeat(text, text, bigint, text[]);

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
