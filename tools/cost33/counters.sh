#!/bin/bash
# What one job costs PostgreSQL in forge.jobs_step's drain, counted rather than timed (issue 33's
# budget: limits, unique keys and job flow must cost a queue without limits < 5 % of its
# throughput): the loop of tools/exp35/today.sql (completions of the previous batch of 128 and a
# claim of the next, one transaction per call, one connection) over JOBS jobs enqueued by the
# revision's forge.jobs_enqueue, then, per job: WAL bytes/records/FPI (pg_stat_wal), the
# backend's CPU, and per statement inside jobs_step (pg_stat_statements with track = all) the
# calls, shared buffers hit/read/dirtied and WAL; per index of forge.jobs its scans and buffer
# hits (maintenance included); per function its calls (track_functions = all: triggers too).
#
#   tools/cost33/counters.sh URL REV KEEP [JOBS]
#
# URL: a PostgreSQL 15 server (superuser) loaded with shared_preload_libraries =
# pg_stat_statements, pg_stat_statements.track = all, track_functions = all, used by nothing
# else (pg_stat_wal is the server's); a database cost33_<pid> is created and dropped. REV: the
# git revision whose schema (migrations and function files) is built. KEEP: true (completed
# jobs kept) or false (deleted). JOBS: 20000. Figures are per job; compare revisions line by line.
# EXTRA_SQL: SQL run after the schema is built (a variant: e.g. 'DROP TRIGGER ... ON forge.jobs').
set -euo pipefail
URL=$1; REV=$2; KEEP=$3; N=${4:-20000}
HERE=$(cd "$(dirname "$0")" && pwd)
DB=cost33_$$
U=${URL%/*}/$DB
trap 'psql "$URL" -XAtq -c "DROP DATABASE IF EXISTS $DB" >/dev/null' EXIT
"$HERE/setup.sh" "$URL" "$DB" "$REV" "$N"
q() { psql "$U" -XAtq "$@"; }
sleep 1
q >/dev/null -c "SELECT pg_stat_statements_reset()" -c "SELECT pg_stat_reset()" \
  -c "SELECT pg_stat_reset_shared('wal')"
CPU=$(q <<SQL
SELECT split_part(s, ' ', 14)::bigint + split_part(s, ' ', 15)::bigint FROM pg_read_file('/proc/self/stat') AS s;
SET cost33.keep = $KEEP;
\\i $HERE/drain.sql
SELECT split_part(s, ' ', 14)::bigint + split_part(s, ' ', 15)::bigint FROM pg_read_file('/proc/self/stat') AS s;
SQL
)
sleep 1.5   # an ended session's statistics are flushed at its exit
echo "== $REV ($(git rev-parse --short "$REV"))${EXTRA_SQL:+ + $EXTRA_SQL}, completed $([ "$KEEP" = true ] && echo kept || echo deleted), $N jobs, per job"
echo "$CPU" | awk -v n="$N" -v hz="$(getconf CLK_TCK)" 'NR == 1 { a = $1 } END { printf "backend CPU %.1f us\n", ($1 - a) * 1e6 / hz / n }'
q -F' ' -c "SELECT 'WAL', round(wal_bytes / $N.0, 1), 'B,', round(wal_records / $N.0, 2), 'records,', round(wal_fpi / $N.0, 3), 'FPI' FROM pg_stat_wal"
echo "-- statements (calls, shared hit, read, dirtied, WAL B, WAL records per job; ms total)"
q -F' | ' <<SQL
SELECT to_char(calls / $N.0, '0.000'), to_char(shared_blks_hit / $N.0, '990.00'),
       to_char(shared_blks_read / $N.0, '0.00'), to_char(shared_blks_dirtied / $N.0, '0.000'),
       to_char(wal_bytes / $N.0, '9990.0'), to_char(wal_records / $N.0, '90.00'),
       round(total_exec_time::numeric), left(regexp_replace(query, '\s+', ' ', 'g'), 110)
  FROM pg_stat_statements
 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND NOT toplevel
   AND calls > 1
 ORDER BY shared_blks_hit DESC
SQL
echo "-- forge.jobs (heap hits, idx scans, tuples fetched by index, updates, HOT, deletes per job)"
q -F' ' <<SQL
SELECT round(io.heap_blks_hit / $N.0, 2), 'heap hits,', round(t.idx_scan / $N.0, 3), 'idx scans,',
       round(t.idx_tup_fetch / $N.0, 2), 'fetched,', round(t.n_tup_upd / $N.0, 2), 'upd,',
       round(t.n_tup_hot_upd / $N.0, 2), 'HOT,', round(t.n_tup_del / $N.0, 2), 'del'
  FROM pg_stat_user_tables t JOIN pg_statio_user_tables io USING (relid)
 WHERE t.schemaname = 'forge' AND t.relname = 'jobs'
SQL
echo "-- indexes of forge.jobs (buffer hits incl. maintenance, scans, tuples read per job)"
q -F' ' <<SQL
SELECT rpad(i.indexrelname, 24), round(io.idx_blks_hit / $N.0, 2), 'hits,',
       round(i.idx_scan / $N.0, 3), 'scans,', round(i.idx_tup_read / $N.0, 2), 'read'
  FROM pg_stat_user_indexes i JOIN pg_statio_user_indexes io USING (indexrelid)
 WHERE i.schemaname = 'forge' AND i.relname = 'jobs'
 ORDER BY 1
SQL
echo "-- functions (calls per job, self ms total)"
q -F' ' -c "SELECT rpad(schemaname || '.' || funcname, 32), round(calls / $N.0, 3), round(self_time::numeric) FROM pg_stat_user_functions ORDER BY 1"
