-- Enqueues a batch of jobs in one statement. Arrays are parallel, one element per job.
--
-- A unique job (a key, or p_unique: its arguments' md5 as the key) is decided under its row of
-- forge.job_keys, locked first (INSERT ... ON CONFLICT DO UPDATE: a concurrent enqueuer of the
-- key waits for this transaction to end, then sees its job), in (kind, key) order so that two
-- batches never deadlock. p_unique_opts says, per job, {"states": [...], "period_ms": n,
-- "mode": "keep" | "replace" | "keep_earliest_run_at"} (NULL: the unfinished states - pending too -, no period,
-- keep). The job holding the key blocks another while it is in one of the states and, with a
-- period, less than period_ms after it was enqueued (a holder whose row is gone counts as
-- completed). A blocked job is not inserted: with keep it reports the holder (inserted = false);
-- with replace or keep_earliest_run_at, a holder that waits (available, scheduled, retryable)
-- takes the new arguments and run_at (the earlier of both: keep_earliest_run_at) and is reported
-- replaced; a running holder keeps running, and the new job is inserted and holds the key.
DROP FUNCTION IF EXISTS forge.jobs_enqueue(text, text[], text[], jsonb[], smallint[], timestamptz[], bigint[], integer[], bigint[], text[], text[], boolean[]);
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
    p_unique       boolean[],
    p_unique_opts  jsonb[]
) RETURNS TABLE (ord integer, id bigint, inserted boolean, replaced boolean)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := clock_timestamp();
    v_ids     bigint[];
    v_new     bigint[];
    v_wake    text[];
    v_due     timestamptz;
    v_set     jsonb;
    v_keyed   integer[];
    v_u       record;
    v_holder  bigint;
    v_until   timestamptz;
    v_created boolean;
    v_state   text;
    v_at      timestamptz;
    v_answers jsonb := '{}';
BEGIN
    -- What forge.jobs_live has no CHECK constraint for (migration 0017): an attempt count or a
    -- timeout below 1 (NULL: the node's default, none).
    IF 1 > ANY (p_max_attempts) OR 1 > ANY (p_timeouts_ms) THEN
        RAISE EXCEPTION USING ERRCODE = 'check_violation',
            MESSAGE = 'forge.jobs_enqueue: max_attempts and timeout_ms must be at least 1 (or NULL)',
            HINT = 'NULL takes [jobs] default_max_attempts and no timeout';
    END IF;
    -- Ids first, so that each input row knows its id whether or not it is inserted.
    SELECT array_agg(nextval('forge.jobs_id_seq') ORDER BY g) INTO v_ids
      FROM generate_series(1, cardinality(p_kinds)) AS g;
    -- The unique jobs: inserted one by one below, under their key's row.
    SELECT coalesce(array_agg(g), '{}') INTO v_keyed
      FROM generate_series(1, cardinality(p_kinds)) AS g
     WHERE p_unique_keys[g] IS NOT NULL OR p_unique[g];

    WITH input AS (
        SELECT u.id, u.queue, u.kind, u.args, u.priority, u.max_attempts, u.timeout_ms, u.role,
               greatest(v_now, coalesce(u.at, v_now + coalesce(u.delay_ms, 0) * interval '1 millisecond')) AS run_at
          FROM unnest(v_ids, p_queues, p_kinds, p_args, p_priorities, p_run_at, p_delays_ms,
                      p_max_attempts, p_timeouts_ms, p_roles) WITH ORDINALITY
               AS u(id, queue, kind, args, priority, at, delay_ms, max_attempts, timeout_ms, role, ord)
         WHERE u.ord <> ALL (v_keyed)
    ), ins AS (
        -- (Into the partition of unfinished jobs itself: its bound is checked for less than
        -- routing through forge.jobs costs, 19k instructions per one-job enqueue.)
        INSERT INTO forge.jobs_live AS j (id, namespace, queue, kind, args, state, priority, run_at,
                                          max_attempts, timeout_ms, role, created_at, phase)
        SELECT i.id, p_namespace, i.queue, i.kind, i.args,
               CASE WHEN i.run_at > v_now THEN 'scheduled' ELSE 'available' END,
               i.priority, i.run_at, i.max_attempts, i.timeout_ms, i.role, v_now,
               -- (The state's phase, so that the trigger of forge.jobs_phase is not called.)
               CASE WHEN i.run_at > v_now THEN 'scheduled' ELSE 'ready' END
          FROM input i
         ORDER BY i.id
        RETURNING j.id, j.queue, j.role, j.state, j.run_at
    )
    SELECT array_agg(ins.id),
           array_agg(DISTINCT CASE WHEN ins.role IS NULL THEN ins.queue ELSE '@' || ins.role END)
               FILTER (WHERE ins.state = 'available'),
           min(ins.run_at) FILTER (WHERE ins.state = 'scheduled')
      INTO v_new, v_wake, v_due
      FROM ins;

    -- The unique jobs, in (kind, key) order. v_answers: ord -> [id, inserted, replaced].
    FOR v_u IN
        SELECT k.ord, k.key, k.run_at, coalesce(k.opts->>'mode', 'keep') AS mode,
               (k.opts->>'period_ms')::bigint AS period_ms,
               CASE WHEN k.opts ? 'states'
                    THEN ARRAY(SELECT jsonb_array_elements_text(k.opts->'states'))
                    ELSE '{pending,available,scheduled,running,retryable}'::text[] END AS states
          FROM (SELECT g AS ord, p_unique_opts[g] AS opts,
                       coalesce(p_unique_keys[g], md5(p_args[g]::text)) AS key,
                       greatest(v_now, coalesce(p_run_at[g], v_now + coalesce(p_delays_ms[g], 0)
                                                 * interval '1 millisecond')) AS run_at
                  FROM unnest(v_keyed) AS g) k
         ORDER BY p_kinds[k.ord], k.key, k.ord
    LOOP
        INSERT INTO forge.job_keys AS x (namespace, kind, unique_key, job_id, enqueued_at, held_until)
        VALUES (p_namespace, p_kinds[v_u.ord], v_u.key, v_ids[v_u.ord], v_now,
                v_now + v_u.period_ms * interval '1 millisecond')
        ON CONFLICT (namespace, kind, unique_key) DO UPDATE SET job_id = x.job_id
        RETURNING x.job_id, x.held_until, (x.xmax = 0) INTO v_holder, v_until, v_created;
        v_state := NULL;
        IF NOT v_created THEN
            -- The holder, locked (a claim skips it meanwhile); gone: counted as completed.
            SELECT j.state INTO v_state
              FROM forge.jobs j WHERE j.id = v_holder FOR NO KEY UPDATE;
            v_state := coalesce(v_state, 'completed');
            IF NOT (v_state = ANY (v_u.states)
                    AND (v_until IS NULL OR v_now < v_until)) THEN
                v_state := NULL;  -- not blocked
            END IF;
        END IF;
        IF v_state IS NOT NULL AND v_u.mode <> 'keep'
           AND v_state IN ('available', 'scheduled', 'retryable') THEN
            -- Debounce: the waiting holder takes the new arguments and run_at.
            UPDATE forge.jobs j
               SET args = p_args[v_u.ord],
                   run_at = CASE WHEN v_u.mode = 'keep_earliest_run_at'
                                 THEN least(j.run_at, v_u.run_at) ELSE v_u.run_at END,
                   state = CASE WHEN (CASE WHEN v_u.mode = 'keep_earliest_run_at'
                                           THEN least(j.run_at, v_u.run_at) ELSE v_u.run_at END) > v_now
                                THEN CASE WHEN j.state = 'retryable' THEN 'retryable' ELSE 'scheduled' END
                                ELSE 'available' END
             WHERE j.id = v_holder
            RETURNING j.state, j.run_at INTO v_state, v_at;
            IF v_state = 'available' THEN
                PERFORM pg_notify('forge_jobs', p_namespace || ' ' || coalesce('@' || p_roles[v_u.ord], p_queues[v_u.ord]));
            ELSE
                PERFORM pg_notify('forge_jobs_due',
                                  p_namespace || ' ' || (extract(epoch FROM v_at) * 1000)::bigint);
            END IF;
            v_answers := v_answers || jsonb_build_object(v_u.ord::text, jsonb_build_array(v_holder, false, true));
        ELSIF v_state IS NOT NULL AND (v_u.mode = 'keep' OR v_state <> 'running') THEN
            v_answers := v_answers || jsonb_build_object(v_u.ord::text, jsonb_build_array(v_holder, false, false));
        ELSE
            -- Inserted; it holds the key (a running holder, under replace, no longer does).
            INSERT INTO forge.jobs AS j (id, namespace, queue, kind, args, state, priority, run_at,
                                         max_attempts, timeout_ms, role, unique_key, created_at)
            VALUES (v_ids[v_u.ord], p_namespace, p_queues[v_u.ord], p_kinds[v_u.ord], p_args[v_u.ord],
                    CASE WHEN v_u.run_at > v_now THEN 'scheduled' ELSE 'available' END,
                    p_priorities[v_u.ord], v_u.run_at, p_max_attempts[v_u.ord],
                    p_timeouts_ms[v_u.ord], p_roles[v_u.ord], v_u.key, v_now);
            IF NOT v_created THEN
                UPDATE forge.job_keys x
                   SET job_id = v_ids[v_u.ord], enqueued_at = v_now,
                       held_until = v_now + v_u.period_ms * interval '1 millisecond'
                 WHERE x.namespace = p_namespace AND x.kind = p_kinds[v_u.ord]
                   AND x.unique_key = v_u.key;
            END IF;
            IF v_u.run_at > v_now THEN
                PERFORM pg_notify('forge_jobs_due',
                                  p_namespace || ' ' || (extract(epoch FROM v_u.run_at) * 1000)::bigint);
            ELSE
                PERFORM pg_notify('forge_jobs', p_namespace || ' ' || coalesce('@' || p_roles[v_u.ord], p_queues[v_u.ord]));
            END IF;
            v_answers := v_answers || jsonb_build_object(v_u.ord::text, jsonb_build_array(v_ids[v_u.ord], true, false));
        END IF;
    END LOOP;

    -- Delivered on commit only: a rolled-back enqueue wakes nobody.
    PERFORM pg_notify('forge_jobs', p_namespace || ' ' || w) FROM unnest(v_wake) AS w;
    IF v_due IS NOT NULL THEN
        PERFORM pg_notify('forge_jobs_due',
                          p_namespace || ' ' || (extract(epoch FROM v_due) * 1000)::bigint);
    END IF;

    -- No unique job (the common case): the ids are the answer.
    IF cardinality(v_keyed) = 0 THEN
        RETURN QUERY SELECT t.ord::integer, t.id, true, false
                       FROM unnest(v_ids) WITH ORDINALITY AS t(id, ord);
        RETURN;
    END IF;
    -- (A jsonb object as the answers of the unique jobs: a join of two unnest() calls gets a
    -- nested loop from the planner's 10-row guess, quadratic for big batches.)
    RETURN QUERY
    SELECT t.ord::integer,
           coalesce((v_answers->t.ord::text->>0)::bigint, t.id),
           coalesce((v_answers->t.ord::text->>1)::boolean, true),
           coalesce((v_answers->t.ord::text->>2)::boolean, false)
      FROM unnest(v_ids) WITH ORDINALITY AS t(id, ord);
END;
$$;
