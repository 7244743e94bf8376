#!/bin/bash
# The drain's backend CPU per job (tools/cost33/counters.sh) of several variants, in alternating
# rounds so that a busy minute of a shared machine falls on all of them; then each one's median.
#
#   tools/cost33/cpu_rounds.sh URL KEEP ROUNDS VARIANT...
#
# VARIANT: REV, or REV+SQL (SQL run after the schema is built, as counters.sh's EXTRA_SQL).
set -euo pipefail
URL=$1; KEEP=$2; ROUNDS=$3; shift 3
HERE=$(cd "$(dirname "$0")" && pwd)
declare -A cpu
for r in $(seq "$ROUNDS"); do
  for v in "$@"; do
    rev=${v%%+*}; sql=""; [[ $v == *+* ]] && sql=${v#*+}
    us=$(EXTRA_SQL=$sql "$HERE/counters.sh" "$URL" "$rev" "$KEEP" | awk '/^backend CPU/ { print $3 }')
    cpu[$v]="${cpu[$v]:-} $us"
    echo "round $r: $v: $us us per job (load $(cut -d' ' -f1 /proc/loadavg))"
  done
done
for v in "$@"; do
  echo "MEDIAN $v: $(echo ${cpu[$v]} | tr ' ' '\n' | sort -n | awk '{ a[NR] = $1 } END { print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }') us per job (${cpu[$v]} )"
done
