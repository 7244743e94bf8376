-- Writes gauge samples (series, label, value) for an interval, fenced.
CREATE OR REPLACE FUNCTION forge.stats_sample(
    p_namespace text,
    p_role      text,
    p_epoch     bigint,
    p_tenure    bigint,
    p_at        timestamptz,
    p_series    text[],
    p_labels    text[],
    p_values    double precision[]
) RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM forge.fence(p_namespace, p_role, p_epoch, p_tenure);
    INSERT INTO forge.stats AS st (namespace, at, series, label, value)
    SELECT p_namespace, p_at, s.series, s.label, s.value
      FROM unnest(p_series, p_labels, p_values) AS s(series, label, value)
    ON CONFLICT (namespace, series, label, at) DO UPDATE SET value = EXCLUDED.value;
END;
$$;
