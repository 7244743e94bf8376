#!/usr/bin/env bash
# Runs one benchmark of two revisions side by side, in one run: builds `bench_jobs` (or another
# forge-tools binary) of each revision in release mode, then runs their rounds alternately
# (A, B, A, B, ...) so that a slow minute of a shared machine falls on both, and prints each
# round's summary lines (those in CAPITALS, e.g. THROUGHPUT) and the medians side by side.
#
#   tools/compare_revs.sh 3e09348 HEAD                                   # throughput, 3 rounds
#   tools/compare_revs.sh --rounds 5 3e09348 HEAD -- --quick --only throughput --nodes 1
#   tools/compare_revs.sh --bin bench_jobs 3e09348 HEAD -- --quick --only limit
#
# Each revision is checked out in a worktree under $COMPARE_DIR (default /tmp/forge-compare) and
# built with its own target directory there (a first build takes minutes). Each round of each
# revision starts its own throwaway PostgreSQL, as the benchmark does alone.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=3
bin=bench_jobs
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds="${2:?--rounds needs a number}"; shift ;;
        --bin) bin="${2:?--bin needs a binary of forge-tools}"; shift ;;
        -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        --) break ;;
        -*) echo "compare_revs.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
        *) break ;;
    esac
    shift
done
[ $# -ge 2 ] || { echo "compare_revs.sh: give two revisions (see --help)" >&2; exit 2; }
revs=("$1" "$2")
shift 2
[ "${1:-}" = "--" ] && shift
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--quick --only throughput)

dir=${COMPARE_DIR:-/tmp/forge-compare}
mkdir -p "$dir"
binaries=()
for rev in "${revs[@]}"; do
    sha=$(git rev-parse --short=9 "$rev^{commit}")
    tree="$dir/$sha"
    if [ ! -d "$tree" ]; then
        git worktree add --detach "$tree" "$sha" >/dev/null
    fi
    echo "building $bin of $rev ($sha) in $tree ..." >&2
    (cd "$tree" && CARGO_TARGET_DIR="$tree/target" cargo build --release -q -p forge-tools --bin "$bin")
    binaries+=("$tree/target/release/$bin")
done

out="$dir/rounds.$$"
mkdir -p "$out"
for round in $(seq 1 "$rounds"); do
    for i in 0 1; do
        echo "round $round, ${revs[$i]}: $bin ${args[*]}" >&2
        "${binaries[$i]}" "${args[@]}" >"$out/$i.$round" 2>"$out/$i.$round.err" || {
            echo "compare_revs.sh: $bin of ${revs[$i]} failed in round $round:" >&2
            tail -20 "$out/$i.$round.err" >&2
            exit 1
        }
    done
done

# The summary lines of each revision's rounds (those starting with a word in capitals), and per
# summary line the median over the rounds of each of its "median N" and "pNN N" figures (p50,
# p99: a --quick round prints percentiles, not medians), in order.
summary='^[A-Z][A-Z]+[ ,:]'
figure='(median|p[0-9]+) [0-9.]+'
echo "$bin ${args[*]}, $rounds alternating rounds each, $(date -u +%F), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for i in 0 1; do
    echo "== ${revs[$i]} ($(git rev-parse --short=9 "${revs[$i]}^{commit}"))"
    for round in $(seq 1 "$rounds"); do
        grep -E "$summary" "$out/$i.$round" | grep -E "$figure" | sed "s/^/  round $round: /"
    done
done
echo "== medians over the rounds of each summary line's figures (A = ${revs[0]}, B = ${revs[1]})"
cat "$out"/0.[0-9]* | grep -E "$summary" | grep -E "$figure" | sed -E 's/:.*//' | sort -u |
    while IFS= read -r label; do
        # Column k: the k-th "median N" of the line, one row per round.
        figures() {
            for f in "$out/$1".[0-9]*; do
                case "$f" in *.err) continue ;; esac
                grep -F "$label:" "$f" | head -1 | grep -Eo "$figure" | cut -d' ' -f2 | paste -sd' '
            done
        }
        paste -d'|' <(figures 0) <(figures 1) | awk -F'|' -v l="$label" '
            { na = split($1, xa, " "); split($2, xb, " ");
              for (k = 1; k <= na; k++) { A[k, NR] = xa[k]; B[k, NR] = xb[k] } n = na; r = NR }
            function med(X, k,   i, j, v, t, m) {
                m = 0; for (i = 1; i <= r; i++) { v[++m] = X[k, i] }
                for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
                return (m % 2) ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2 }
            END { for (k = 1; k <= n; k++) { ma = med(A, k); mb = med(B, k);
                  f = (ma < 100) ? "%.2f" : "%.0f";
                  printf "  %s [%d]: A " f "  B " f "  B/A %.3f\n", l, k, ma, mb, (ma ? mb / ma : 0) } }'
    done
echo "(rounds' full output: $out)"
