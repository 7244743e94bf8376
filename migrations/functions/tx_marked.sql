-- Whether the current transaction set the mark (see forge.tx_mark).
CREATE OR REPLACE FUNCTION forge.tx_marked(p_mark text) RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT position('|' || p_mark || '|' IN coalesce(current_setting('forge.completed', true), '')) > 0;
$$;
