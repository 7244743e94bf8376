#!/bin/bash
# What one claim of 128 reads when R jobs are running: with today's layout a running job has
# left jobs_claim; with the advisory-lock (L) and unlogged-claims (U) designs it is still
# 'available' there, so every claim walks past the running jobs' entries (L: a failed
# pg_try_advisory_lock each, U: a primary-key probe of the claims each). Enqueues 10,000+R jobs,
# claims R of them in another session (which keeps running, so that L's locks stay held), then
# prints EXPLAIN (ANALYZE, BUFFERS) of the next claim, rolled back, five times (the last shown).
#
#   tools/exp35/walk.sh URL VARIANT R     (VARIANT: T, L or U)
set -euo pipefail
URL=$1; VARIANT=$2; R=$3
HERE=$(dirname "$0")
case $VARIANT in T) FILES="today";; L) FILES="common l_claim";; U) FILES="common u_claim";; esac
DB=exp35_walk_$$
U=${URL%/*}/$DB
"$HERE/schema.sh" "$URL" "$DB" HEAD $FILES
trap 'kill $! 2>/dev/null; wait; psql "$URL" -XAtq -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null' EXIT
psql "$U" -XAtq -c "SELECT count(*) FROM forge.jobs_enqueue('forge',
      array_fill('default'::text, ARRAY[10000 + $R]), array_fill('noop'::text, ARRAY[10000 + $R]),
      array_fill('null'::jsonb, ARRAY[10000 + $R]), array_fill(0::smallint, ARRAY[10000 + $R]),
      array_fill(NULL::timestamptz, ARRAY[10000 + $R]), array_fill(NULL::bigint, ARRAY[10000 + $R]),
      array_fill(NULL::integer, ARRAY[10000 + $R]), array_fill(NULL::bigint, ARRAY[10000 + $R]),
      array_fill(NULL::text, ARRAY[10000 + $R]), array_fill(NULL::text, ARRAY[10000 + $R]),
      array_fill(false, ARRAY[10000 + $R]), array_fill(NULL::jsonb, ARRAY[10000 + $R]))" \
  -c "VACUUM ANALYZE forge.jobs" >/dev/null
# The running jobs: claimed in batches of 128 by a session that then stays (L's locks).
psql "$U" -XAtq >/dev/null <<SQL &
DO \$\$ BEGIN
  IF '$VARIANT' = 'L' THEN
    -- (One session's own locks are taken again by its own claims: lock the first R directly.)
    PERFORM pg_advisory_lock(j.id) FROM (SELECT id FROM forge.jobs ORDER BY id LIMIT $R) j;
  ELSE
    FOR g IN 1..ceil($R / 128.0)::int LOOP PERFORM exp.step('{}', '{}', true, '{}'); COMMIT; END LOOP;
  END IF;
END \$\$;
\! sleep 60
SQL
case $VARIANT in
  T) RUNNING="SELECT count(*) FROM forge.jobs WHERE state = 'running'";;
  L) RUNNING="SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted";;
  U) RUNNING="SELECT count(*) FROM exp.claims";;
esac
until [ "$(psql "$U" -XAtc "$RUNNING")" -ge "$R" ]; do sleep 0.2; done
sleep 1   # the claimer's commit
for i in 1 2 3 4 5; do
  psql "$U" -XAtq -c "BEGIN" -c "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) SELECT * FROM exp.step('{}', '{}', true, '{}')" -c "ROLLBACK"
done | tail -4 | sed "s/^/$VARIANT, $R running: /"
