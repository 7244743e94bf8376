-- U: claims recorded in an UNLOGGED table (no WAL); forge.jobs is not written at claim. The claim
-- walks jobs_claim skipping jobs with a claim row (a primary-key probe per entry: running jobs
-- stay in jobs_claim) and jobs another claim is taking (a transaction-level advisory lock, no
-- WAL; a row lock would write a record), inserts its rows ON CONFLICT DO NOTHING (the claims'
-- primary key decides against claims its snapshot cannot see), then keeps only the jobs still
-- available under a fresh snapshot (a claim whose snapshot predates a completion). Completion:
-- an update to 'completed' (attempt counted, node and claim time copied from the claim row) or
-- a delete, guarded by this node's claim row, which it deletes.
CREATE UNLOGGED TABLE exp.claims (
    job_id     bigint      PRIMARY KEY,
    namespace  text        NOT NULL,
    queue      text        NOT NULL,
    node_id    text        NOT NULL,
    claimed_at timestamptz NOT NULL,
    started_at timestamptz,
    limited    boolean     NOT NULL DEFAULT false
);
-- Rescue and the operators' view: running jobs by node.
CREATE INDEX claims_node ON exp.claims (namespace, node_id);
CREATE FUNCTION exp.claim() RETURNS TABLE (id bigint, attempt integer) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_claimed bigint[];
BEGIN
    WITH i AS (
        INSERT INTO exp.claims (job_id, namespace, queue, node_id, claimed_at, started_at)
        SELECT c.id, 'forge', 'default', 'writes', clock_timestamp(), clock_timestamp()
          FROM (SELECT c.id FROM forge.jobs c
                 WHERE c.namespace = 'forge' AND c.queue = 'default' AND c.state = 'available'
                   AND c.role IS NULL AND c.kind = ANY (ARRAY['noop'])
                   AND NOT EXISTS (SELECT 1 FROM exp.claims x WHERE x.job_id = c.id)
                   AND pg_try_advisory_xact_lock(c.id)
                 ORDER BY c.priority, c.run_at, c.id LIMIT 128) c
        ON CONFLICT DO NOTHING RETURNING job_id)
    SELECT array_agg(i.job_id) INTO v_claimed FROM i;
    DELETE FROM exp.claims c WHERE c.job_id = ANY (v_claimed)
       AND NOT EXISTS (SELECT 1 FROM forge.jobs j WHERE j.id = c.job_id AND j.state = 'available');
    RETURN QUERY
    SELECT j.id, j.attempt + 1 FROM forge.jobs j JOIN exp.claims c ON c.job_id = j.id
     WHERE j.id = ANY (v_claimed) AND c.node_id = 'writes';
END $$;
CREATE FUNCTION exp.finish(p_ids bigint[], p_keep boolean) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_keep THEN
        UPDATE forge.jobs j SET state = 'completed', attempt = j.attempt + 1, node_id = c.node_id,
               attempted_at = c.claimed_at, started_at = c.started_at,
               finished_at = clock_timestamp()
          FROM exp.claims c
         WHERE c.job_id = ANY (p_ids) AND c.node_id = 'writes' AND j.id = c.job_id;
    ELSE
        DELETE FROM forge.jobs j USING exp.claims c
         WHERE c.job_id = ANY (p_ids) AND c.node_id = 'writes' AND j.id = c.job_id;
    END IF;
    DELETE FROM exp.claims c WHERE c.job_id = ANY (p_ids) AND c.node_id = 'writes';
END $$;
