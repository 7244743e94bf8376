#!/bin/bash
# Drain rates of the variants in alternating rounds (each round runs every variant once, in
# order), so that the machine's load, which moves a lot on a shared VM, falls on all of them
# alike. Prints each round's load average and each run's figure line (measure.sh).
#
#   tools/exp35/rates.sh URL ROUNDS KEEP VARIANT... [JOBS in $JOBS, 20000]
set -euo pipefail
URL=$1; ROUNDS=$2; KEEP=$3; shift 3
HERE=$(dirname "$0")
for r in $(seq "$ROUNDS"); do
  echo "round $r, load $(cut -d' ' -f1-3 /proc/loadavg)"
  for v in "$@"; do
    "$HERE/measure.sh" "$URL" "$v" "$KEEP" "${JOBS:-20000}" | sed -n 1p
  done
done
