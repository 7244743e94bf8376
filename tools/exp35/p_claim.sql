-- P (applied after s2_claim.sql, whose completion it keeps): the claim is a HOT update that
-- writes the truth (state 'running', the node, the attempt, its times): no index names state
-- or node_id any more. A stored generated column, phase, is
-- what the partial indexes name: 'ready' for available and running jobs alike, the state
-- otherwise. So the claim changes no indexed value (phase stays 'ready') and its new version
-- stays on its page (forge.jobs_live at fillfactor 40) with no index entry. Claims walk
-- jobs_claim (phase 'ready') past the running jobs (a heap visit each). The node's running
-- jobs are found by the lane's durable row (exp.lanes: the ids of its last claim, once per
-- round trip) instead of jobs_running.
ALTER TABLE forge.jobs ADD COLUMN phase text GENERATED ALWAYS AS
    (CASE WHEN state IN ('available', 'running') THEN 'ready' ELSE state END) STORED;
DROP INDEX forge.jobs_claim, forge.jobs_claim_role, forge.jobs_due, forge.jobs_running,
           forge.jobs_finished, forge.jobs_dead, forge.jobs_pending;
CREATE INDEX jobs_claim ON forge.jobs_live (namespace, queue, priority, run_at, id) INCLUDE (kind)
    WHERE phase = 'ready' AND role IS NULL;
CREATE INDEX jobs_claim_role ON forge.jobs_live (namespace, role, queue, priority, run_at, id)
    INCLUDE (kind) WHERE phase = 'ready' AND role IS NOT NULL;
CREATE INDEX jobs_due ON forge.jobs_live (namespace, run_at) INCLUDE (queue, kind, phase)
    WHERE phase IN ('scheduled', 'retryable');
CREATE INDEX jobs_finished ON forge.jobs_live (namespace, phase, finished_at)
    WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_dead ON forge.jobs_live (namespace, queue, kind) INCLUDE (run_at)
    WHERE phase = 'dead';
CREATE INDEX jobs_pending ON forge.jobs_live (namespace, queue, kind) INCLUDE (run_at)
    WHERE phase = 'pending';
ALTER TABLE forge.jobs_live SET (fillfactor = 40);
CREATE TABLE exp.lanes (
    lane       text PRIMARY KEY,
    queue      text NOT NULL,
    running    bigint[] NOT NULL,
    claimed_at timestamptz NOT NULL
) WITH (fillfactor = 40);
INSERT INTO exp.lanes VALUES ('writes', 'default', '{}', now());
CREATE OR REPLACE FUNCTION exp.claim() RETURNS TABLE (id bigint, attempt integer) LANGUAGE sql AS $$
    WITH u AS (
        UPDATE forge.jobs_live j
           SET state = 'running', attempt = j.attempt + 1, node_id = 'writes',
               attempted_at = clock_timestamp(), started_at = clock_timestamp()
         WHERE j.ctid = ANY (ARRAY(
               SELECT c.ctid FROM forge.jobs_live c
                WHERE c.namespace = 'forge' AND c.queue = 'default' AND c.phase = 'ready'
                  AND c.state = 'available' AND c.role IS NULL AND c.kind = ANY (ARRAY['noop'])
                ORDER BY c.priority, c.run_at, c.id LIMIT 128 FOR UPDATE SKIP LOCKED))
        RETURNING j.id, j.attempt
    ), l AS (
        UPDATE exp.lanes l SET running = coalesce((SELECT array_agg(u.id) FROM u), '{}'),
               claimed_at = clock_timestamp()
         WHERE l.lane = 'writes'
    )
    SELECT u.id, u.attempt FROM u
$$;
