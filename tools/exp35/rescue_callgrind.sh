#!/bin/bash
# The instructions forge.jobs_rescue spends per rescued job at git revision REV, counted exactly
# by valgrind's callgrind in a single-user backend (a figure the machine's load does not move):
# the database of tools/exp35/rescue.sh (R jobs running on a node marked down, LIVE on a live
# one), then one call of forge.jobs_rescue of the R jobs (skipping locked rows, as the
# scheduler's pass does), only that function counted. The server of URL (PGDATA: its data
# directory) is stopped for the run and started again: use a throwaway one. EXTRA_SQL: a file
# applied to the database first (a variant of a function).
#
#   PGDATA=... tools/exp35/rescue_callgrind.sh URL REV R [LIVE]
set -euo pipefail
URL=$1; REV=$2; R=$3; LIVE=${4:-0}
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$(pg_config --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)
DB=exp35_rescue_cg_$$
OUT=$(mktemp -d)
chown postgres "$OUT"
RESCUE_DB=$DB "$HERE/rescue.sh" "$URL" "$REV" "$R" "$LIVE"
[ -z "${EXTRA_SQL:-}" ] || psql "${URL%/*}/$DB" -XAtq -v ON_ERROR_STOP=1 -f "$EXTRA_SQL" >/dev/null
runuser -u postgres -- "$BIN/pg_ctl" -D "$PGDATA" -w stop >/dev/null
restart() {
  runuser -u postgres -- "$BIN/pg_ctl" -D "$PGDATA" -l "$PGDATA/../log" -w start >/dev/null
  psql "$URL" -XAtq -c "DROP DATABASE IF EXISTS $DB" >/dev/null
  [ -n "${KEEP_OUT:-}" ] || rm -rf "$OUT"
}
trap restart EXIT
cat > "$OUT/q.sql" <<SQL
SELECT count(*) FROM forge.jobs_rescue(
  (SELECT array_agg(id ORDER BY id) FROM forge.jobs WHERE state = 'running' AND node_id = 'writes'),
  (SELECT array_agg(attempt ORDER BY id) FROM forge.jobs WHERE state = 'running' AND node_id = 'writes'),
  array_fill('node writes is down'::text, ARRAY[$R]), array_fill(true, ARRAY[$R]), 25, true);

SQL
runuser -u postgres -- valgrind --tool=callgrind --toggle-collect=plpgsql_exec_function \
    --callgrind-out-file="$OUT/cg" "$BIN/postgres" --single -j -D "$PGDATA" "$DB" \
    < "$OUT/q.sql" >/dev/null 2>"$OUT/log"
IR=$(grep -m1 '^totals:' "$OUT/cg" | awk '{ print $2 }')
echo "$REV${EXTRA_SQL:+ + $EXTRA_SQL}, R=$R LIVE=$LIVE: forge.jobs_rescue $((IR / R)) instructions per rescued job"
