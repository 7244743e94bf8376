-- Enqueues a batch of jobs in one statement. Arrays are parallel, one element per job. A unique
-- job that collides with an unfinished job of the same kind and key is not inserted; the row
-- for it reports inserted = false and the id of the job it collided with.
CREATE OR REPLACE FUNCTION forge.jobs_enqueue(
    p_namespace    text,
    p_queues       text[],
    p_kinds        text[],
    p_args         jsonb[],
    p_priorities   smallint[],
    p_run_at       timestamptz[],
    p_delays_ms    bigint[],
    p_max_attempts integer[],
    p_timeouts_ms  bigint[],
    p_roles        text[],
    p_unique_keys  text[],
    p_unique       boolean[]
) RETURNS TABLE (ord integer, id bigint, inserted boolean)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_now  timestamptz := clock_timestamp();
    v_ids  bigint[];
    v_new  bigint[];
    v_wake text[];
    v_due  timestamptz;
    v_set  jsonb;
BEGIN
    -- Ids first, so that each input row knows its id whether or not it is inserted.
    SELECT array_agg(nextval('forge.jobs_id_seq') ORDER BY g) INTO v_ids
      FROM generate_series(1, cardinality(p_kinds)) AS g;

    WITH input AS (
        SELECT u.id, u.queue, u.kind, u.args, u.priority, u.max_attempts, u.timeout_ms, u.role,
               coalesce(u.unique_key, CASE WHEN u.is_unique THEN md5(u.args::text) END) AS unique_key,
               greatest(v_now, coalesce(u.at, v_now + coalesce(u.delay_ms, 0) * interval '1 millisecond')) AS run_at
          FROM unnest(v_ids, p_queues, p_kinds, p_args, p_priorities, p_run_at, p_delays_ms,
                      p_max_attempts, p_timeouts_ms, p_roles, p_unique_keys, p_unique)
               AS u(id, queue, kind, args, priority, at, delay_ms, max_attempts, timeout_ms, role,
                    unique_key, is_unique)
    ), ins AS (
        INSERT INTO forge.jobs AS j (id, namespace, queue, kind, args, state, priority, run_at,
                                     max_attempts, timeout_ms, role, unique_key, created_at)
        SELECT i.id, p_namespace, i.queue, i.kind, i.args,
               CASE WHEN i.run_at > v_now THEN 'scheduled' ELSE 'available' END,
               i.priority, i.run_at, i.max_attempts, i.timeout_ms, i.role, i.unique_key, v_now
          FROM input i
         ORDER BY i.id
        ON CONFLICT (namespace, kind, unique_key)
           WHERE unique_key IS NOT NULL AND state IN ('available', 'scheduled', 'running', 'retryable')
           DO NOTHING
        RETURNING j.id, j.queue, j.role, j.state, j.run_at
    )
    SELECT array_agg(ins.id),
           array_agg(DISTINCT CASE WHEN ins.role IS NULL THEN ins.queue ELSE '@' || ins.role END)
               FILTER (WHERE ins.state = 'available'),
           min(ins.run_at) FILTER (WHERE ins.state = 'scheduled')
      INTO v_new, v_wake, v_due
      FROM ins;

    -- Delivered on commit only: a rolled-back enqueue wakes nobody.
    PERFORM pg_notify('forge_jobs', p_namespace || ' ' || w) FROM unnest(v_wake) AS w;
    IF v_due IS NOT NULL THEN
        PERFORM pg_notify('forge_jobs_due',
                          p_namespace || ' ' || (extract(epoch FROM v_due) * 1000)::bigint);
    END IF;

    -- Every row inserted (the common case): the ids are the answer.
    IF coalesce(cardinality(v_new), 0) = cardinality(v_ids) THEN
        RETURN QUERY SELECT t.ord::integer, t.id, true
                       FROM unnest(v_ids) WITH ORDINALITY AS t(id, ord);
        RETURN;
    END IF;
    -- Some were duplicates. (A jsonb object as the set of inserted ids: a join of two unnest()
    -- calls gets a nested loop from the planner's 10-row guess, quadratic for big batches.)
    v_set := coalesce((SELECT jsonb_object_agg(x::text, true) FROM unnest(v_new) AS x), '{}');
    -- A duplicate reports the job it collided with. This runs as a new statement, so it sees a
    -- colliding job committed by a concurrent enqueuer after this call began.
    RETURN QUERY
    SELECT t.ord::integer,
           CASE WHEN v_set ? t.id::text THEN t.id
                ELSE (SELECT e.id FROM forge.jobs e
                       WHERE e.namespace = p_namespace AND e.kind = p_kinds[t.ord]
                         AND e.unique_key = coalesce(p_unique_keys[t.ord],
                               CASE WHEN p_unique[t.ord] THEN md5(p_args[t.ord]::text) END)
                       ORDER BY e.id DESC LIMIT 1) END,
           v_set ? t.id::text
      FROM unnest(v_ids) WITH ORDINALITY AS t(id, ord);
END;
$$;
