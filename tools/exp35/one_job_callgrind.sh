#!/bin/bash
# The instructions PostgreSQL spends per one-job round trip of forge.jobs_step at git revision REV
# (what pickup latency pays: a worker that claims one job at a time), counted exactly by
# valgrind's callgrind in a single-user backend: N jobs enqueued, then N calls that each claim
# one job and report the previous one completed (KEEP: whether completed jobs are kept), one
# transaction each. The server of URL (PGDATA: its data directory) is stopped for the run and
# started again: use a throwaway one. EXTRA_SQL: a file applied to the database first (a
# variant). OUT: keep callgrind's file there (read it with callgrind_annotate --inclusive=yes).
# ENQUEUE=1: count instead N one-job enqueues, one transaction each (what a producer that
# enqueues one job at a time pays; KEEP is then unused).
#
#   PGDATA=... tools/exp35/one_job_callgrind.sh URL REV KEEP [N]
set -euo pipefail
URL=$1; REV=$2; KEEP=$3; N=${4:-1000}
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$(pg_config --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)
DB=exp35_one_$$
TMP=$(mktemp -d)
chown postgres "$TMP"
"$HERE/schema.sh" "$URL" "$DB" "$REV"
q() { psql "${URL%/*}/$DB" -XAtq -v ON_ERROR_STOP=1 "$@"; }
[ -z "${EXTRA_SQL:-}" ] || q -f "$EXTRA_SQL" >/dev/null
# (The 13 arguments of the enqueue since unique options; the 22 of the step both layouts take.)
q >/dev/null <<SQL
SELECT count(*) FROM forge.jobs_enqueue('forge',
      array_fill('default'::text, ARRAY[$N]), array_fill('noop'::text, ARRAY[$N]),
      array_fill('null'::jsonb, ARRAY[$N]), array_fill(0::smallint, ARRAY[$N]),
      array_fill(NULL::timestamptz, ARRAY[$N]), array_fill(NULL::bigint, ARRAY[$N]),
      array_fill(NULL::integer, ARRAY[$N]), array_fill(NULL::bigint, ARRAY[$N]),
      array_fill(NULL::text, ARRAY[$N]), array_fill(NULL::text, ARRAY[$N]),
      array_fill(false, ARRAY[$N]), array_fill(NULL::jsonb, ARRAY[$N]));
VACUUM ANALYZE;
CHECKPOINT;
SQL
[ -n "${ENQUEUE:-}" ] || runuser -u postgres -- "$BIN/pg_ctl" -D "$PGDATA" -w stop >/dev/null
restart() {
  runuser -u postgres -- "$BIN/pg_ctl" -D "$PGDATA" -l "$PGDATA/../log" -w start >/dev/null
  psql "$URL" -XAtq -c "DROP DATABASE IF EXISTS $DB" >/dev/null
  [ -z "${OUT:-}" ] || cp "$TMP/cg" "$OUT"
  rm -rf "$TMP"
}
trap restart EXIT
if [ -n "${ENQUEUE:-}" ]; then
  q -c "DELETE FROM forge.jobs" -c "VACUUM ANALYZE forge.jobs" -c "CHECKPOINT" >/dev/null
  runuser -u postgres -- "$BIN/pg_ctl" -D "$PGDATA" -w stop >/dev/null
fi
cat > "$TMP/q.sql" <<SQL
DO \$\$
DECLARE ids bigint[] := '{}'; atts integer[] := '{}'; nids bigint[]; natts integer[];
BEGIN
  LOOP
    SELECT array_agg(s.id), array_agg(s.attempt) INTO nids, natts
      FROM forge.jobs_step('forge', 'writes', 'default', NULL, NULL, NULL, 1, 1, ARRAY['noop'],
             1, 1, '{}'::bigint[], ids, atts,
             array_fill('completed'::text, ARRAY[cardinality(ids)]),
             array_fill(NULL::bigint, ARRAY[cardinality(ids)]),
             array_fill(NULL::jsonb, ARRAY[cardinality(ids)]), 25, NULL, NULL, NULL, $KEEP) s
     WHERE s.claimed;
    COMMIT;
    EXIT WHEN nids IS NULL;
    ids := nids; atts := natts;
  END LOOP;
END
\$\$;

SQL
[ -z "${ENQUEUE:-}" ] || cat > "$TMP/q.sql" <<SQL
DO \$\$
BEGIN
  FOR i IN 1..$N LOOP
    PERFORM forge.jobs_enqueue('forge', ARRAY['default'], ARRAY['noop'], ARRAY['null'::jsonb],
              ARRAY[0::smallint], ARRAY[NULL::timestamptz], ARRAY[NULL::bigint],
              ARRAY[NULL::integer], ARRAY[NULL::bigint], ARRAY[NULL::text], ARRAY[NULL::text],
              ARRAY[false], ARRAY[NULL::jsonb]);
    COMMIT;
  END LOOP;
END
\$\$;

SQL
runuser -u postgres -- valgrind --tool=callgrind --callgrind-out-file="$TMP/cg" \
    "$BIN/postgres" --single -j -D "$PGDATA" "$DB" < "$TMP/q.sql" >/dev/null 2>"$TMP/log"
IR=$(grep -m1 '^summary:' "$TMP/cg" | awk '{ print $2 }')
[ -z "${ENQUEUE:-}" ] || { echo "$REV${EXTRA_SQL:+ + $EXTRA_SQL}: $((IR / N)) instructions per one-job enqueue ($N)"; exit 0; }
echo "$REV${EXTRA_SQL:+ + $EXTRA_SQL}, completed $([ "$KEEP" = true ] && echo kept || echo deleted): $((IR / N)) instructions per one-job round trip ($N)"
