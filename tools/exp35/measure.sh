#!/bin/bash
# What a job costs PostgreSQL in writes under one design variant: WAL (position, pg_stat_wal,
# and, when the server's pg_wal is readable here, records by type from pg_waldump) and row
# writes per table (pg_stat_user_tables) per job, for the enqueue (forge.jobs_enqueue, 1,000
# jobs per call and transaction) and for the drain (exp.step in a DO loop: claims of 128, each
# call recording the previous batch as completed, one transaction per call, as a worker's
# round trip), on one connection, nothing else around. Then the loop's drain rate (of this
# loop, on this machine's load: compare variants only within one run, alternating).
#
#   tools/exp35/measure.sh URL VARIANT KEEP [JOBS]
#
# URL: a server (superuser; a database exp35_<variant>_<pid> is created and dropped); VARIANT:
# T (today's forge.jobs_step), S (today's writes, stripped), L (advisory-lock claim), U
# (unlogged claims table), HS, HL, HU (the same claims, kept completions moved into a
# partitioned history; LR, HLR: L and HL plus a durable row per lane written once per round
# trip, r_lane.sql; PSQL_VARS='-v hist_index=brin|none' for its index, btree by default;
# S2 (today's writes on today's layout: jobs_live, completed jobs moved to jobs_done), K
# (row-lock claim, lane list), KH (HOT claim, claimed_by), P (HOT claim, phase), KX (K with a
# literal exclusion list), K2, KX2, KH2 (K, KX, KH beside another lane's 512 claims), PC, PT
# (P with a phase set by the writers under a CHECK, or kept by a BEFORE trigger);
# KEEP: true (completed jobs kept) or false (deleted); JOBS: 20000.
set -euo pipefail
URL=$1; VARIANT=$2; KEEP=$3; N=${4:-20000}
HERE=$(dirname "$0")
case $VARIANT in
  T) FILES="today";; S) FILES="common s_claim";; L) FILES="common l_claim";;
  U) FILES="common u_claim";; HS) FILES="common s_claim h_table h_s";;
  HL) FILES="common l_claim h_table h_l";; HU) FILES="common u_claim h_table h_u";;
  LR) FILES="common l_claim r_lane";; HLR) FILES="common l_claim h_table h_l r_lane";;
  S2) FILES="common s2_claim";; K) FILES="common k_claim";; KH) FILES="common kh_claim";;
  P) FILES="common s2_claim p_claim";; PC) FILES="common s2_claim p_claim pc_claim";; PT) FILES="common s2_claim p_claim pt_claim";; KX) FILES="common k_claim kx_claim";;
  K2) FILES="common k_claim k_other_lane";; KX2) FILES="common k_claim kx_claim k_other_lane";;
  KH2) FILES="common kh_claim kh_other_lane";;
  *) echo "unknown variant $VARIANT (T, S, L, U, HS, HL, HU, LR, HLR, S2, K, KH, P, PC, PT, KX, K2, KX2, KH2)" >&2; exit 2;;
esac
DB=exp35_${VARIANT,,}_$$
U=${URL%/*}/$DB
"$HERE/schema.sh" "$URL" "$DB" HEAD $FILES
trap 'psql "$URL" -XAtq -c "DROP DATABASE IF EXISTS $DB" >/dev/null' EXIT
UNLOCK=false; [[ $VARIANT == *L* ]] && UNLOCK=true
lsn() { psql "$U" -XAtq -c "SELECT pg_current_wal_insert_lsn()"; }
snap() {
  psql "$U" -XAtq -c "SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint || '|' || wal_records || '|' || wal_fpi FROM pg_stat_wal"
}
tables() {
  psql "$U" -XAtq -F' ' -c "SELECT schemaname || '.' || relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del
                              FROM pg_stat_user_tables
                             WHERE (schemaname = 'forge' AND relname = 'jobs') OR schemaname = 'exp'"
}
PGDATA_DIR=$(psql "$U" -XAtq -c "SHOW data_directory")
waldump() {  # records by type between two WAL positions, per job
  if [ -r "$PGDATA_DIR/pg_wal" ]; then
    "$(pg_config --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)/pg_waldump" -p "$PGDATA_DIR/pg_wal" -s "$1" -e "$2" --stats=record 2>&1 \
      | awk -v n="$N" '$1 ~ /^(Heap|Heap2|Btree|Transaction|Standby)\// && $2 > 0 {
                        printf "%s %.2f, ", $1, $2 / n }'
    echo
  fi
}
psql "$U" -XAtq -c "CHECKPOINT" >/dev/null
T0=$(tables); S0=$(snap); L0=$(lsn)
psql "$U" -XAtq >/dev/null <<SQL
DO \$\$
BEGIN
  FOR g IN 1..$N / 1000 LOOP
    PERFORM forge.jobs_enqueue('forge', array_fill('default'::text, ARRAY[1000]),
      array_fill('noop'::text, ARRAY[1000]), array_fill('null'::jsonb, ARRAY[1000]),
      array_fill(0::smallint, ARRAY[1000]), array_fill(NULL::timestamptz, ARRAY[1000]),
      array_fill(NULL::bigint, ARRAY[1000]), array_fill(NULL::integer, ARRAY[1000]),
      array_fill(NULL::bigint, ARRAY[1000]), array_fill(NULL::text, ARRAY[1000]),
      array_fill(NULL::text, ARRAY[1000]), array_fill(false, ARRAY[1000]),
      array_fill(NULL::jsonb, ARRAY[1000]));
    COMMIT;
  END LOOP;
END
\$\$;
SQL
sleep 1.5   # the statistics of an ended session are flushed at its exit
T1=$(tables); S1=$(snap); L1=$(lsn)
START=$(date +%s.%N)
# The drain's backend CPU (user + system, /proc/self/stat of the backend: superuser's
# pg_read_file), before and after: less sensitive to the machine's load than the rate.
CPU=$(psql "$U" -XAtq <<SQL
SELECT split_part(s, ' ', 14)::bigint + split_part(s, ' ', 15)::bigint
  FROM pg_read_file('/proc/self/stat') AS s;
DO \$\$
DECLARE
  ids bigint[] := '{}'; atts integer[] := '{}'; done bigint[] := '{}';
  nids bigint[]; natts integer[];
BEGIN
  LOOP
    SELECT array_agg(s.id), array_agg(s.attempt) INTO nids, natts
      FROM exp.step(ids, atts, $KEEP, done) s;
    COMMIT;
    IF $UNLOCK THEN done := ids; END IF;
    EXIT WHEN nids IS NULL;
    ids := nids; atts := natts;
  END LOOP;
END
\$\$;
SELECT split_part(s, ' ', 14)::bigint + split_part(s, ' ', 15)::bigint
  FROM pg_read_file('/proc/self/stat') AS s;
SQL
)
END=$(date +%s.%N)
CPU_US=$(echo "$CPU" | awk -v n="$N" -v hz="$(getconf CLK_TCK)" 'NR == 1 { a = $1 } END { printf "%.1f", ($1 - a) * 1e6 / hz / n }')
sleep 1.5
T2=$(tables); S2=$(snap); L2=$(lsn)
LEFT=$(psql "$U" -XAtq -c "SELECT count(*) FROM forge.jobs WHERE state NOT IN ('completed')")
HIST=$(psql "$U" -XAtq -c "SELECT coalesce((SELECT count(*) FROM exp.jobs_history), 0)" 2>/dev/null || echo 0)
python3 - "$N" "$VARIANT" "$KEEP" "$START" "$END" "$S0" "$S1" "$S2" "$T0" "$T1" "$T2" "$LEFT" "$HIST" "$CPU_US" <<'PY'
import sys
n, variant, keep = int(sys.argv[1]), sys.argv[2], sys.argv[3]
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
            rows.append(f"{tab}: {x[0]:.2f} ins, {x[1]:.2f} upd ({x[2]:.2f} HOT), {x[3]:.2f} del")
    print(f"  {name:8} WAL {wal:5.0f} B, {rec:5.2f} records, {fpi:.3f} FPI per job; " + "; ".join(rows))
print(f"{variant}, completed {'kept' if keep == 'true' else 'deleted'}: {n} jobs "
      f"({sys.argv[12]} unfinished left, {sys.argv[13]} in history), loop drain {n / secs:.0f} jobs/s, "
      f"its backend's CPU {sys.argv[14]} us per job")
part(0, 1, "enqueue")
part(1, 2, "drain")
PY
echo "  enqueue records: $(waldump "$L0" "$L1")"
echo "  drain records:   $(waldump "$L1" "$L2")"
