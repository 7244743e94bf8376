#!/bin/bash
# How long the scheduler's pass takes to find and take back the R running jobs of a node that
# died, at git revision REV (issue 35: "rescue after a SIGKILL no slower"), beside LIVE jobs
# running on a live node (default 0). Enqueues 10,000+R+LIVE jobs, claims LIVE of them as node
# `live` and R as node `writes` through forge.jobs_step (batches of 500), marks `writes` down,
# then five times, each in a fresh copy of that database (a template's clone, its relations
# prewarmed, so that no round sees another's dead row versions): the lost jobs as
# forge.jobs_maintain finds them (through forge.jobs_running since migration 0016, the running
# jobs by state before), then forge.jobs_rescue of them. Prints each round.
#
#   tools/exp35/rescue.sh URL REV R [LIVE]
#
# With RESCUE_DB=NAME: builds that database only (no rounds) and leaves it for the caller
# (tools/exp35/rescue_callgrind.sh).
set -euo pipefail
URL=$1; REV=$2; R=$3; LIVE=${4:-0}
HERE=$(dirname "$0")
DB=${RESCUE_DB:-exp35_rescue_$$}
U=${URL%/*}/$DB
"$HERE/schema.sh" "$URL" "$DB" "$REV"
[ -n "${RESCUE_DB:-}" ] || trap 'psql "$URL" -XAtq -c "DROP DATABASE IF EXISTS ${DB}_r WITH (FORCE)" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null' EXIT
N=$((10000 + R + LIVE))
psql "$U" -XAtq -c "SELECT count(*) FROM forge.jobs_enqueue('forge',
      array_fill('default'::text, ARRAY[$N]), array_fill('noop'::text, ARRAY[$N]),
      array_fill('null'::jsonb, ARRAY[$N]), array_fill(0::smallint, ARRAY[$N]),
      array_fill(NULL::timestamptz, ARRAY[$N]), array_fill(NULL::bigint, ARRAY[$N]),
      array_fill(NULL::integer, ARRAY[$N]), array_fill(NULL::bigint, ARRAY[$N]),
      array_fill(NULL::text, ARRAY[$N]), array_fill(NULL::text, ARRAY[$N]),
      array_fill(false, ARRAY[$N]), array_fill(NULL::jsonb, ARRAY[$N]))" \
  -c "VACUUM ANALYZE forge.jobs" >/dev/null
# The claims: the 22 arguments both layouts take (since 0016 a 23rd, p_held, defaults to NULL).
psql "$U" -XAtq -v ON_ERROR_STOP=1 >/dev/null <<SQL
INSERT INTO forge.nodes (namespace, node_id, started_at, heartbeat_at)
VALUES ('forge', 'live', now(), now());
INSERT INTO forge.job_lanes VALUES ('forge', 'live', 'default', 1, 1, now());
DO \$\$
DECLARE claimed integer; n integer; node text; r integer;
BEGIN
  FOREACH node IN ARRAY ARRAY['live', 'writes'] LOOP
    claimed := 0;
    r := CASE node WHEN 'live' THEN $LIVE ELSE $R END;
    WHILE claimed < r LOOP
      SELECT count(*) INTO n
        FROM forge.jobs_step('forge', node, 'default', NULL, NULL, NULL, 1, 1, ARRAY['noop'],
               least(500, r - claimed), least(500, r - claimed), '{}'::bigint[], '{}'::bigint[],
               '{}'::integer[], '{}'::text[], '{}'::bigint[], '{}'::jsonb[], 25, NULL, NULL,
               NULL, true) s
       WHERE s.claimed;
      claimed := claimed + n;
      COMMIT;
    END LOOP;
  END LOOP;
END
\$\$;
UPDATE forge.nodes SET down_at = now(), down_reason = 'killed (tools/exp35/rescue.sh)'
 WHERE node_id = 'writes';
VACUUM ANALYZE forge.jobs;
SQL
# (As the revision's forge.jobs_maintain reads them.)
if [ "$(psql "$U" -XAtq -c "SELECT to_regprocedure('forge.jobs_running(text, text, boolean)') IS NOT NULL")" = t ]; then
  FROM="forge.jobs_running('forge', NULL, p_maybe_lost => true) j"; WHERE="true"
elif [ "$(psql "$U" -XAtq -c "SELECT to_regprocedure('forge.jobs_running(text, text)') IS NOT NULL")" = t ]; then
  FROM="forge.jobs_running('forge', NULL) j"; WHERE="true"
else
  FROM="forge.jobs j"; WHERE="j.namespace = 'forge' AND j.state = 'running'"
fi
psql "$U" -XAtq -c "CREATE EXTENSION IF NOT EXISTS pg_prewarm" >/dev/null
psql "$URL" -XAtq -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '$DB'" >/dev/null
[ -z "${RESCUE_DB:-}" ] || exit 0
for round in 1 2 3 4 5; do
  psql "$URL" -XAtq -c "DROP DATABASE IF EXISTS ${DB}_r" -c "CREATE DATABASE ${DB}_r TEMPLATE $DB" >/dev/null
  psql "${URL%/*}/${DB}_r" -XAtq -v ON_ERROR_STOP=1 <<SQL 2>&1 | sed 's/^NOTICE:  //'
SELECT count(pg_prewarm(c.oid)) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'forge' AND c.relkind IN ('r', 'i') \gset
-- (forge.jobs_rescue's statements planned first, as in a session that rescued before.)
SELECT count(*) FROM forge.jobs_rescue(ARRAY[-1]::bigint[], ARRAY[1], ARRAY['warm-up'],
                                       ARRAY[true], 25, true) \gset
DO \$\$
DECLARE t0 timestamptz; t1 timestamptz; t2 timestamptz; v_ids bigint[]; v_att integer[];
        v_why text[]; n integer;
BEGIN
  t0 := clock_timestamp();
  -- forge.jobs_maintain's lost jobs (the leadership test of role jobs left out: none here).
  SELECT array_agg(l.id), array_agg(l.attempt), array_agg(l.reason)
    INTO v_ids, v_att, v_why
    FROM (SELECT j.id, j.attempt,
                 CASE WHEN nd.node_id IS NULL THEN 'not a member'
                      WHEN nd.stopped_at IS NOT NULL THEN 'stopped'
                      WHEN nd.down_at IS NOT NULL THEN 'down' END AS reason
            FROM $FROM
            LEFT JOIN forge.nodes nd ON nd.namespace = j.namespace AND nd.node_id = j.node_id
           WHERE $WHERE) l
   WHERE l.reason IS NOT NULL;
  t1 := clock_timestamp();
  SELECT count(*) INTO n
    FROM forge.jobs_rescue(v_ids, v_att, v_why, array_fill(true, ARRAY[cardinality(v_ids)]),
                           25, true);
  t2 := clock_timestamp();
  RAISE NOTICE '$REV R=$R LIVE=$LIVE: found % running jobs in % ms, rescued them in % ms',
    cardinality(v_ids), round(extract(epoch FROM t1 - t0) * 1000, 2),
    round(extract(epoch FROM t2 - t1) * 1000, 2);
END
\$\$;
SQL
done
psql "$URL" -XAtq -c "DROP DATABASE IF EXISTS ${DB}_r" >/dev/null
