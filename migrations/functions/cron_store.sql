-- Creates or changes a stored cron (a row of forge.crons with a job) and tells the nodes at once
-- (channel forge_crons, payload '<namespace> <cron>': the scheduler's leader restarts that cron's
-- loop with the new definition). Answers 'created', 'updated', 'unchanged', or 'code' when a cron
-- of code has that name (nothing is written: the names of code crons are theirs). A change keeps
-- the cron's ledger, its pause and its pending "trigger now".
CREATE OR REPLACE FUNCTION forge.cron_store(
    p_namespace  text,
    p_name       text,
    p_expression text,
    p_timezone   text,
    p_kind       text,
    p_args       jsonb,
    p_options    jsonb,
    p_by         text
) RETURNS text
LANGUAGE plpgsql
AS $$
DECLARE
    v_old forge.crons;
BEGIN
    SELECT * INTO v_old FROM forge.crons c
     WHERE c.namespace = p_namespace AND c.name = p_name
       FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO forge.crons (namespace, name, role, expression, timezone, last_seen_by,
                                 job_kind, job_args, options, stored_at, stored_by)
        VALUES (p_namespace, p_name, 'scheduler', p_expression, p_timezone, p_by,
                p_kind, p_args, p_options, clock_timestamp(), p_by)
        ON CONFLICT (namespace, name) DO NOTHING;
        IF NOT FOUND THEN
            -- A node registered a cron of code with that name meanwhile.
            RETURN 'code';
        END IF;
        PERFORM pg_notify('forge_crons', p_namespace || ' ' || p_name);
        RETURN 'created';
    END IF;
    IF v_old.job_kind IS NULL THEN
        RETURN 'code';
    END IF;
    IF v_old.expression = p_expression AND v_old.timezone = p_timezone
       AND v_old.job_kind = p_kind AND v_old.job_args = p_args AND v_old.options = p_options THEN
        RETURN 'unchanged';
    END IF;
    UPDATE forge.crons c
       SET expression = p_expression, timezone = p_timezone, job_kind = p_kind,
           job_args = p_args, options = p_options, stored_at = clock_timestamp(),
           stored_by = p_by, last_seen_at = clock_timestamp(), last_seen_by = p_by
     WHERE c.namespace = p_namespace AND c.name = p_name;
    PERFORM pg_notify('forge_crons', p_namespace || ' ' || p_name);
    RETURN 'updated';
END;
$$;
