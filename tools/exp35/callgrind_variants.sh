#!/bin/bash
# Instructions per job, exact (tools/cost33/callgrind.sh: a single-user backend under valgrind's
# callgrind, whatever the machine's load), of the prototypes' drains against today's jobs_step:
# T (forge.jobs_step), S2 (today's writes alone), K (row-lock claim, lane list), KH (HOT claim,
# claimed_by), P, PC, PT (HOT claim, phase generated, set by writers, kept by a trigger),
# completed jobs deleted and kept. The server of URL (its data directory in PGDATA) is stopped
# during each run: a throwaway one. OUT: a directory for callgrind's files (callgrind_annotate
# --inclusive=yes OUT/K.false.out).
#
#   PGDATA=... tools/exp35/callgrind_variants.sh URL OUT [JOBS]
set -euo pipefail
URL=$1; OUT=$2; N=${3:-10240}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"; chmod 777 "$OUT"
variant() {  # the files of a variant, replacing today.sql's exp.step
  echo "DROP FUNCTION exp.step(bigint[],integer[],boolean,bigint[]);"
  cat "$HERE/common.sql"; for f in "$@"; do cat "$HERE/$f.sql"; done
}
for keep in false true; do
  "$HERE/../cost33/callgrind.sh" "$URL" HEAD "$keep" "$N" "$OUT/T.$keep.out" | tail -1 | sed "s/^HEAD/T/"
  for v in S2:s2_claim K:k_claim KH:kh_claim P:s2_claim+p_claim PC:s2_claim+p_claim+pc_claim PT:s2_claim+p_claim+pt_claim; do
    v=${v//+/ }
    # shellcheck disable=SC2086 # (a variant's files, space-separated)
    EXTRA_SQL="$(variant ${v#*:})" "$HERE/../cost33/callgrind.sh" "$URL" HEAD "$keep" "$N" \
      "$OUT/${v%%:*}.$keep.out" | tail -1 | sed "s/^.*, completed/${v%%:*}, completed/"
  done
done
