-- forge.fence_holds (see schema/functions/fence_holds.sql) for statements that must not go on
-- without the fence: raises SQLSTATE FG001 (Error::Fenced), with a DETAIL saying why, instead
-- of answering false.
CREATE OR REPLACE FUNCTION forge.fence(p_namespace text, p_role text, p_epoch bigint, p_tenure bigint)
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    l forge.leaders%ROWTYPE;
BEGIN
    IF NOT forge.fence_holds(p_namespace, p_role, p_epoch, p_tenure) THEN
        SELECT * INTO l FROM forge.leaders WHERE namespace = p_namespace AND role = p_role;
        RAISE EXCEPTION USING
            ERRCODE = 'FG001',
            MESSAGE = format('fenced: role %s epoch %s is no longer the current leadership',
                             p_role, p_epoch),
            DETAIL = CASE
                WHEN l.role IS NULL THEN 'the role has no leadership record'
                WHEN l.epoch <> p_epoch OR l.tenure <> p_tenure
                    THEN format('the current leadership is epoch %s on node %s', l.epoch, l.node_id)
                WHEN l.released_at IS NOT NULL THEN 'the leadership was handed over'
                ELSE 'the lock session of the leadership is gone from this server' END;
    END IF;
END;
$$;
