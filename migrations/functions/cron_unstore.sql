-- Deletes a stored cron and tells the nodes at once (channel forge_crons): the scheduler's leader
-- stops its loop (a run in progress ends first). Its ledger stays until [cron] ledger_retention
-- prunes it. Answers 'deleted', 'missing', or 'code' for a cron of code (which is not deleted:
-- it is registered again by the nodes that have it).
CREATE OR REPLACE FUNCTION forge.cron_unstore(p_namespace text, p_name text) RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_kind text;
BEGIN
    SELECT c.job_kind INTO v_kind FROM forge.crons c
     WHERE c.namespace = p_namespace AND c.name = p_name
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'missing';
    END IF;
    IF v_kind IS NULL THEN
        RETURN 'code';
    END IF;
    DELETE FROM forge.crons c WHERE c.namespace = p_namespace AND c.name = p_name;
    PERFORM pg_notify('forge_crons', p_namespace || ' ' || p_name);
    RETURN 'deleted';
END;
$$;
