#!/bin/bash
# forge.jobs_rescue of R running jobs of a node marked down, beside LIVE running on a live node,
# timed at several git revisions with their rounds interleaved, the order rotated each round (so
# that the machine's drift, and what one round leaves the next to write, fall on every revision
# alike): one database per revision built by tools/exp35/rescue.sh (RESCUE_DB), then ROUNDS times
# for each revision a fresh copy of it, a checkpoint, its relations prewarmed, forge.jobs_rescue
# planned once, and one timed call (skipping locked rows, as the scheduler's pass does). Prints
# each round, each revision's median, min and max, and the median of each revision's difference
# from the first one's round by round.
#
#   tools/exp35/rescue_rounds.sh URL R LIVE ROUNDS REV...
set -euo pipefail
URL=$1; R=$2; LIVE=$3; ROUNDS=$4; shift 4
HERE=$(cd "$(dirname "$0")" && pwd)
BASE=${URL%/*}
dbs=()
cleanup() {
  for db in "${dbs[@]}" exp35_rounds_$$; do
    psql "$URL" -XAtq -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null
  done
}
trap cleanup EXIT
for rev in "$@"; do
  db=exp35_rounds_$$_$(git rev-parse --short "$rev")
  dbs+=("$db")
  RESCUE_DB=$db "$HERE/rescue.sh" "$URL" "$rev" "$R" "$LIVE"
  psql "$BASE/$db" -XAtq -c "CREATE EXTENSION IF NOT EXISTS pg_prewarm" >/dev/null
done
out=$(mktemp)
for round in $(seq 1 "$ROUNDS"); do
  n=${#dbs[@]}
  for k in $(seq 0 $((n - 1))); do
    i=$(( (k + round) % n ))
    rev=${*:i+1:1}
    psql "$URL" -XAtq -c "DROP DATABASE IF EXISTS exp35_rounds_$$" \
      -c "CREATE DATABASE exp35_rounds_$$ TEMPLATE ${dbs[$i]}" -c "CHECKPOINT" >/dev/null
    ms=$(psql "$BASE/exp35_rounds_$$" -XAtq -v ON_ERROR_STOP=1 2>&1 <<SQL | sed -n 's/^NOTICE:  //p'
SELECT count(pg_prewarm(c.oid)) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = 'forge' AND c.relkind IN ('r', 'i') \gset
SELECT count(*) FROM forge.jobs_rescue(ARRAY[-1]::bigint[], ARRAY[1], ARRAY['warm-up'],
                                       ARRAY[true], 25, true) \gset
DO \$\$
DECLARE t1 timestamptz; v_ids bigint[]; v_att integer[]; n integer;
BEGIN
  SELECT array_agg(id ORDER BY id), array_agg(attempt ORDER BY id) INTO v_ids, v_att
    FROM forge.jobs WHERE state = 'running' AND node_id = 'writes';
  t1 := clock_timestamp();
  SELECT count(*) INTO n
    FROM forge.jobs_rescue(v_ids, v_att, array_fill('node writes is down'::text, ARRAY[$R]),
                           array_fill(true, ARRAY[$R]), 25, true);
  IF n <> $R THEN RAISE EXCEPTION 'rescued % of $R', n; END IF;
  RAISE NOTICE '%', round(extract(epoch FROM clock_timestamp() - t1) * 1000, 2);
END
\$\$;
SQL
)
    echo "round $round $rev: rescued $R in $ms ms"
    echo "$rev $ms $round" >> "$out"
  done
done
for rev in "$@"; do
  sort -n -k2 "$out" | awk -v rev="$rev" '$1 == rev { v[++n] = $2 }
    END { m = n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
          printf "%s: %d rounds, median %.2f ms, min %.2f, max %.2f\n", rev, n, m, v[1], v[n] }'
done
first=$1
for rev in "${@:2}"; do
  awk -v a="$first" -v b="$rev" '$1 == a { x[$3] = $2 } $1 == b { y[$3] = $2 }
    END { for (r in x) if (r in y) print y[r] - x[r] }' "$out" | sort -n \
    | awk -v a="$first" -v b="$rev" '{ v[++n] = $1 }
        END { m = n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
              printf "%s - %s, round by round: median %+.2f ms (%+.2f to %+.2f)\n", b, a, m, v[1], v[n] }'
done
rm -f "$out"
