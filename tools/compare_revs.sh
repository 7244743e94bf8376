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

# The summary lines of each revision's rounds, and per summary line the median of its first
# figure (e.g. "median 61300 jobs/s") over the rounds.
echo "$bin ${args[*]}, $rounds alternating rounds each, $(date -u +%F), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for i in 0 1; do
    echo "== ${revs[$i]} ($(git rev-parse --short=9 "${revs[$i]}^{commit}"))"
    for round in $(seq 1 "$rounds"); do
        grep -E '^[A-Z][A-Z ]+[ :]' "$out/$i.$round" | sed "s/^/  round $round: /"
    done
done
echo "== medians of each summary line's first figure (A = ${revs[0]}, B = ${revs[1]})"
for key in $(cat "$out"/0.* | grep -E '^[A-Z][A-Z ]+' | sed -E 's/^([A-Z][A-Za-z ]+[^:]*):.*/\1/' | tr ' ' '_' | sort -u); do
    label=${key//_/ }
    med() {
        for f in "$out/$1".[0-9]*; do
            case "$f" in *.err) continue ;; esac
            grep -F "$label:" "$f" | head -1 | grep -Eo 'median [0-9.]+' | head -1 | cut -d' ' -f2
        done | sort -n | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]}'
    }
    a=$(med 0)
    b=$(med 1)
    [ -n "$a" ] && [ -n "$b" ] || continue
    awk -v l="$label" -v a="$a" -v b="$b" 'BEGIN {printf "  %-45s A %10.0f  B %10.0f  B/A %6.3f\n", l, a, b, b / a}'
done
rm -rf "$out"
