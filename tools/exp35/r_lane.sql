-- R: the advisory-lock claim (l_claim.sql) plus one durable row per lane, written once per
-- round trip (not per job): the ids the lane runs now and since when. It is what a rescuer
-- reads when the lane's session is gone (the attempts to count, so that a job that kills its
-- node still ends dead), what operators read (which node runs which job since when), and what
-- survives a crash or failover of PostgreSQL (the locks do not): claims after a server change
-- can skip the jobs that live nodes' lanes still name.
CREATE TABLE exp.lanes (
    node_id    text PRIMARY KEY,
    running    bigint[] NOT NULL,
    claimed_at timestamptz[] NOT NULL
);
INSERT INTO exp.lanes VALUES ('writes', '{}', '{}');
ALTER FUNCTION exp.claim() RENAME TO claim_unrecorded;
CREATE FUNCTION exp.claim() RETURNS TABLE (id bigint, attempt integer) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_ids bigint[];
    v_atts integer[];
BEGIN
    SELECT array_agg(c.id), array_agg(c.attempt) INTO v_ids, v_atts FROM exp.claim_unrecorded() c;
    -- (A worker's lane runs the jobs of this claim; the previous ones were completed.)
    UPDATE exp.lanes l SET running = coalesce(v_ids, '{}'),
           claimed_at = array_fill(clock_timestamp(), ARRAY[coalesce(cardinality(v_ids), 0)])
     WHERE l.node_id = 'writes';
    RETURN QUERY SELECT * FROM unnest(v_ids, v_atts);
END $$;
