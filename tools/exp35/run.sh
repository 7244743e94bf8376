#!/bin/bash
# Issue 35's prototypes, all measurements of docs/src/experiments.md ("Jobs: directions for a
# job in fewer writes"), in order. URL: a superuser's URL of a throwaway server of your own
# (databases exp35_* are created and dropped; pg_waldump's figures need its pg_wal readable
# here). The failover test starts two more servers on ports 55436-55437 (as root, running them
# as user postgres); the lock-table test, last, makes URL's server refuse every new connection
# for five seconds.
#
#   tools/exp35/run.sh URL
#
# The exact instruction counts need the server stopped: PGDATA=... tools/exp35/callgrind_variants.sh.
set -euo pipefail
URL=$1
HERE=$(dirname "$0")
echo "== writes per job (measure.sh)"
for v in T S L U HS HL HU LR HLR; do "$HERE/measure.sh" "$URL" "$v" true; done
for v in T S L U LR; do "$HERE/measure.sh" "$URL" "$v" false; done
for i in brin none; do
  echo "(history index: $i)"; PSQL_VARS="-v hist_index=$i" "$HERE/measure.sh" "$URL" HU true
done
echo "== drain rates and CPU, alternating rounds (rates.sh)"
"$HERE/rates.sh" "$URL" 3 true T S L U HS HL HU
"$HERE/rates.sh" "$URL" 2 true T HS HL LR HLR
"$HERE/rates.sh" "$URL" 3 false T S L U
"$HERE/rates.sh" "$URL" 2 false T L LR
echo "== claims that write no index entry: CPU, alternating rounds (rates.sh)"
"$HERE/rates.sh" "$URL" 3 false T S2 K KH P K2 KH2
"$HERE/rates.sh" "$URL" 3 true T S2 K KH P
echo "== a claim's walk past running jobs (walk.sh)"
for v in T U L; do for r in 0 2000; do "$HERE/walk.sh" "$URL" "$v" "$r" | grep -E 'Buffers|Execution'; done; done
echo "== unlogged claims after a crash and on a promoted standby (unlogged_failover.sh)"
"$HERE/unlogged_failover.sh" "/tmp/exp35-ha-$$"; rm -rf "/tmp/exp35-ha-$$"
echo "== the lock table (locks_full.sh)"
"$HERE/locks_full.sh" "$URL"
