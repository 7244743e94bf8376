-- FORGE cluster model: the aggregator's rollup takes the nodes' counters once.
--
-- 0004's forge.stats_rollup read forge.nodes twice, in two statements: a heartbeat that
-- committed between them moved the cursor past counts that never reached the series. Now the
-- deltas and the new cursor come from one read of the nodes, in one statement.

CREATE OR REPLACE FUNCTION forge.stats_rollup(
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
    ), cursor AS (
        INSERT INTO forge.stats_cursor AS c (namespace, node_id, incarnation, tally, at)
        SELECT p_namespace, s.node_id, s.incarnation, s.tally, clock_timestamp()
          FROM now_seen s
        ON CONFLICT (namespace, node_id) DO UPDATE
           SET incarnation = EXCLUDED.incarnation, tally = EXCLUDED.tally, at = EXCLUDED.at
    )
    -- (The cursor's upsert runs whether or not it is read: data-modifying WITH.)
    SELECT count(*) INTO v_rows FROM ins;
    RETURN v_rows;
END;
$$;
