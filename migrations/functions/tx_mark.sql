-- Transaction-local marks: what tick_complete and jobs_complete recorded in the current
-- transaction, kept in a setting local to it (a rollback, also to a savepoint, drops them).
CREATE OR REPLACE FUNCTION forge.tx_mark(p_mark text) RETURNS void
LANGUAGE sql
AS $$
    SELECT set_config('forge.completed',
                      coalesce(current_setting('forge.completed', true), '') || '|' || p_mark || '|',
                      true);
$$;
