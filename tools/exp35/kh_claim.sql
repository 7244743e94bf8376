-- KH: the claim is a HOT update: it writes only columns no index names (the attempt, its
-- times, and claimed_by, a column of its own), never state or node_id, so the new version
-- stays on its page and no index gets an entry (forge.jobs_live at fillfactor 40: at 50, 12 %
-- of the claims found no room on the page). A running job stays 'available' with claimed_by
-- set; claims skip those. The lane's durable row names the jobs of its last claim (for a
-- rescuer), once per round trip.
ALTER TABLE forge.jobs ADD COLUMN claimed_by text;
ALTER TABLE forge.jobs_live SET (fillfactor = 40);
CREATE TABLE exp.lanes (
    lane       text PRIMARY KEY,
    queue      text NOT NULL,
    running    bigint[] NOT NULL,
    claimed_at timestamptz NOT NULL
) WITH (fillfactor = 40);
INSERT INTO exp.lanes VALUES ('writes', 'default', '{}', now());
CREATE FUNCTION exp.claim() RETURNS TABLE (id bigint, attempt integer) LANGUAGE sql AS $$
    WITH u AS (
        UPDATE forge.jobs_live j
           SET attempt = j.attempt + 1, claimed_by = 'writes',
               attempted_at = clock_timestamp(), started_at = clock_timestamp()
         WHERE j.ctid = ANY (ARRAY(
               SELECT c.ctid FROM forge.jobs_live c
                WHERE c.namespace = 'forge' AND c.queue = 'default' AND c.state = 'available'
                  AND c.role IS NULL AND c.kind = ANY (ARRAY['noop']) AND c.claimed_by IS NULL
                ORDER BY c.priority, c.run_at, c.id LIMIT 128 FOR UPDATE SKIP LOCKED))
        RETURNING j.id, j.attempt
    ), l AS (
        UPDATE exp.lanes l SET running = coalesce((SELECT array_agg(u.id) FROM u), '{}'),
               claimed_at = clock_timestamp()
         WHERE l.lane = 'writes'
    )
    SELECT u.id, u.attempt FROM u
$$;
CREATE FUNCTION exp.finish(p_ids bigint[], p_keep boolean) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF NOT p_keep THEN
        DELETE FROM forge.jobs_live j
         WHERE j.id = ANY (p_ids) AND j.state = 'available' AND j.claimed_by = 'writes';
        RETURN;
    END IF;
    WITH d AS (DELETE FROM forge.jobs_live j
                WHERE j.id = ANY (p_ids) AND j.state = 'available' AND j.claimed_by = 'writes'
               RETURNING j.*)
    INSERT INTO forge.jobs_done
    SELECT d.id, d.namespace, d.queue, d.kind, d.args, 'completed', d.priority, d.run_at,
           d.attempt, d.max_attempts, d.timeout_ms, d.role, d.epoch, d.unique_key, 'writes',
           d.attempted_at, clock_timestamp(), d.errors, d.cancel_requested, d.created_at,
           d.tenure, d.started_at, d.unstarted_rescues, d.limited, d.output, d.parents,
           d.parents_left, d.on_parent_failure, d.has_children, d.kind_limited
      FROM d;
END $$;
