#!/bin/bash
# What a job costs PostgreSQL in writes, for FORGE's schema at a git revision: row writes per
# table (pg_stat_user_tables) and WAL (pg_stat_wal, the WAL position) per job, for the enqueue
# (forge.jobs_enqueue, 1,000 jobs per call and transaction) and for the drain (forge.jobs_step
# alone in a DO loop: claims of 128, each call recording the previous batch as completed, one
# transaction per call, as a worker's round trip), on one connection, nothing else around.
#
#   benches/job_writes.sh URL REV [JOBS] [KEEP]
#
# URL: a server (superuser; a database forge_writes_<n> is created and dropped); REV: the git
# revision whose migrations/ is applied (migrations in order, then the function files); JOBS:
# 20000; KEEP: true (completed jobs kept) or false (deleted, completed_retention = "0s").
# The rate it prints is one psql loop's, not FORGE's: use bench_jobs for rates.
set -euo pipefail
URL=$1; REV=$2; N=${3:-20000}; KEEP=${4:-true}
ROOT=$(git rev-parse --show-toplevel)
DB=forge_writes_$$
BASE=${URL%/*}
psql "$URL" -XAtq -c "CREATE DATABASE $DB" >/dev/null
trap 'psql "$URL" -XAtq -c "DROP DATABASE IF EXISTS $DB" >/dev/null' EXIT
U=$BASE/$DB
{
  echo "CREATE SCHEMA forge;"
  for f in $(git -C "$ROOT" ls-tree --name-only "$REV" migrations/ | grep "\.sql$" | sort); do
    git -C "$ROOT" show "$REV:$f"; echo
  done
  echo "SET check_function_bodies = off;"
  for f in $(git -C "$ROOT" ls-tree --name-only "$REV" migrations/functions/ | sort); do
    git -C "$ROOT" show "$REV:$f"; echo
  done
} | psql "$U" -XAtq -v ON_ERROR_STOP=1 >/dev/null 2>&1
snap() {
  psql "$U" -XAtq -c "SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint || '|' || wal_records || '|' || wal_fpi FROM pg_stat_wal"
}
tables() {
  psql "$U" -XAtq -F' ' -c "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del
                              FROM pg_stat_user_tables WHERE schemaname = 'forge' AND relname LIKE 'jobs%'"
}
psql "$U" -XAtq -c "CHECKPOINT" >/dev/null
T0=$(tables); S0=$(snap)
psql "$U" -XAtq >/dev/null <<SQL
DO \$\$
BEGIN
  FOR g IN 1..$N / 1000 LOOP
    PERFORM forge.jobs_enqueue('forge', array_fill('default'::text, ARRAY[1000]),
      array_fill('noop'::text, ARRAY[1000]), array_fill('null'::jsonb, ARRAY[1000]),
      array_fill(0::smallint, ARRAY[1000]), array_fill(NULL::timestamptz, ARRAY[1000]),
      array_fill(NULL::bigint, ARRAY[1000]), array_fill(NULL::integer, ARRAY[1000]),
      array_fill(NULL::bigint, ARRAY[1000]), array_fill(NULL::text, ARRAY[1000]),
      array_fill(NULL::text, ARRAY[1000]), array_fill(false, ARRAY[1000]));
    COMMIT;
  END LOOP;
END
\$\$;
SQL
sleep 1.5   # the statistics of an ended session are flushed at its exit
T1=$(tables); S1=$(snap)
START=$(date +%s.%N)
psql "$U" -XAtq >/dev/null <<SQL
DO \$\$
DECLARE
  ids bigint[] := '{}'; atts integer[] := '{}'; nids bigint[]; natts integer[]; n integer;
BEGIN
  LOOP
    n := cardinality(ids);
    SELECT array_agg(s.id), array_agg(s.attempt) INTO nids, natts
      FROM forge.jobs_step('forge', 'writes', 'default', NULL, NULL, NULL, ARRAY['noop'], 128, 128,
             '{}'::bigint[], ids, atts, array_fill('completed'::text, ARRAY[n]),
             array_fill(NULL::bigint, ARRAY[n]), array_fill(NULL::jsonb, ARRAY[n]), 25,
             NULL, NULL, NULL, $KEEP) s
     WHERE s.claimed;
    COMMIT;
    EXIT WHEN nids IS NULL;
    ids := nids; atts := natts;
  END LOOP;
END
\$\$;
SQL
END=$(date +%s.%N)
sleep 1.5
T2=$(tables); S2=$(snap)
LEFT=$(psql "$U" -XAtq -c "SELECT count(*) FROM forge.jobs WHERE state <> 'completed'")
python3 - "$N" "$REV" "$KEEP" "$START" "$END" "$S0" "$S1" "$S2" "$T0" "$T1" "$T2" "$LEFT" <<'PY'
import sys
n, rev, keep = int(sys.argv[1]), sys.argv[2], sys.argv[3]
secs = float(sys.argv[5]) - float(sys.argv[4])
s = [list(map(int, x.split('|'))) for x in sys.argv[6:9]]
def table(txt):
    d = {}
    for line in txt.strip().splitlines():
        f = line.split(); d[f[0]] = list(map(int, f[1:]))
    return d
t = [table(x) for x in sys.argv[9:12]]
def part(a, b, name):
    wal, rec, fpi = [(s[b][i] - s[a][i]) / n for i in range(3)]
    rows = []
    for tab in sorted(t[b]):
        x = [(t[b][tab][i] - t[a].get(tab, [0] * 4)[i]) / n for i in range(4)]
        if any(x):
            rows.append(f"{tab}: {x[0]:.2f} inserted, {x[1]:.2f} updated ({x[2]:.2f} HOT), {x[3]:.2f} deleted")
    print(f"  {name:9} WAL {wal:5.0f} bytes, {rec:5.2f} records, {fpi:.3f} full pages per job; " + "; ".join(rows))
print(f"{rev}, completed {'kept' if keep == 'true' else 'deleted'}: {n} jobs ({sys.argv[12]} left unfinished), "
      f"drain {n / secs:.0f} jobs/s in this loop")
part(0, 1, "enqueue")
part(1, 2, "drain")
part(0, 2, "total")
PY
