#!/bin/bash
# Instructions per job of forge.jobs_step's drain (tools/cost33/drain.sql), counted exactly by
# valgrind's callgrind in a single-user backend: a figure the machine's load does not move, with
# the functions where they go. The server of URL (PGDATA: its data directory) is stopped for the
# run and started again: use a throwaway one.
#
#   PGDATA=... tools/cost33/callgrind.sh URL REV KEEP JOBS OUT
#
# Writes OUT (callgrind's file; read it with callgrind_annotate --inclusive=yes OUT) and prints
# the instructions per job (the backend's start included: compare variants of one JOBS).
# EXTRA_SQL: as setup.sh's.
set -euo pipefail
URL=$1; REV=$2; KEEP=$3; N=$4; OUT=$5
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=$(pg_config --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)
DB=cost33_cg_$$
"$HERE/setup.sh" "$URL" "$DB" "$REV" "$N"
runuser -u postgres -- "$BIN/pg_ctl" -D "$PGDATA" -w stop >/dev/null
restart() {
  runuser -u postgres -- "$BIN/pg_ctl" -D "$PGDATA" -l "$PGDATA/../log" -w start >/dev/null
  psql "$URL" -XAtq -c "DROP DATABASE IF EXISTS $DB" >/dev/null
}
trap restart EXIT
touch "$OUT"; chown postgres "$OUT"
{ printf 'SET cost33.keep = %s;\n\n' "$KEEP"; cat "$HERE/drain.sql"; printf '\n\n'; } \
  | runuser -u postgres -- valgrind --tool=callgrind --callgrind-out-file="$OUT" \
      "$BIN/postgres" --single -j -D "$PGDATA" "$DB" >/dev/null 2>"$OUT.log"
IR=$(grep -m1 '^summary:' "$OUT" | awk '{ print $2 }')
echo "$REV${EXTRA_SQL:+ + $EXTRA_SQL}, completed $([ "$KEEP" = true ] && echo kept || echo deleted): $((IR / N)) instructions per job ($N jobs)"
