-- H: completed jobs move into an append-only history partitioned by finished_at (an hour per
-- partition here), so no completion writes a finished-by-age entry: pruning drops whole
-- partitions. The one index (psql variable hist_index): btree on id (an operator's lookup by
-- id; the entry of an ever-growing id lands on the rightmost leaf), brin on id (no entry per
-- job), or none. Each h_<claim>.sql redefines exp.finish for kept completions as
-- WITH d AS (DELETE FROM forge.jobs ... RETURNING ...) INSERT INTO exp.jobs_history SELECT ...
CREATE TABLE exp.jobs_history (LIKE forge.jobs) PARTITION BY RANGE (finished_at);
SELECT format('CREATE TABLE exp.jobs_history_%s PARTITION OF exp.jobs_history FOR VALUES FROM (%L) TO (%L)',
              to_char(h, 'YYYYMMDDHH24'), h, h + interval '1 hour')
  FROM generate_series(date_trunc('hour', now()) - interval '1 hour',
                       date_trunc('hour', now()) + interval '3 hours', interval '1 hour') AS h
\gexec
\if :{?hist_index}
\else
\set hist_index btree
\endif
SELECT CASE :'hist_index' WHEN 'btree' THEN 'CREATE INDEX ON exp.jobs_history (id)'
                          WHEN 'brin' THEN 'CREATE INDEX ON exp.jobs_history USING brin (id)' END
 WHERE :'hist_index' <> 'none'
\gexec
-- The history row's select list from the deleted row d: forge.jobs's columns in order, some
-- replaced by the expressions in p_set ({column: expression}).
CREATE FUNCTION exp.history_select(p_set jsonb) RETURNS text LANGUAGE sql AS $$
    SELECT string_agg(coalesce(p_set ->> a.attname, 'd.' || quote_ident(a.attname)), ', '
                      ORDER BY a.attnum)
      FROM pg_attribute a
     WHERE a.attrelid = 'forge.jobs'::regclass AND a.attnum > 0 AND NOT a.attisdropped
$$;
