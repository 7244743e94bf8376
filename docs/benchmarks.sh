#!/usr/bin/env bash
# Regenerates the guide's benchmarks page (docs/src/benchmarks.md): runs every benchmark of the
# crate forge-tools (tools/) and the routing tests, and writes one section per command with the
# command, this machine, today's date and the figures the command printed (its stdout; progress
# goes to stderr and stays on the terminal).
#
#   docs/benchmarks.sh                    # everything, as the page's figures were taken: hours
#   docs/benchmarks.sh --quick            # each tool's quickest mode: minutes, to see it work
#   docs/benchmarks.sh --only bench_cron,soak --out /tmp/benchmarks.md
#
# The page is written only when every command has run (to a temporary file first), so an
# interrupted run leaves the current page as it was. Each tool starts its own throwaway
# PostgreSQL (forge-testkit): PostgreSQL's server binaries must be installed.
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
only=""
out=docs/src/benchmarks.md
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --only) only="${2:?--only needs a comma-separated list of tools}"; shift ;;
        --out) out="${2:?--out needs a file}"; shift ;;
        -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "benchmarks.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done

# The sections, in the page's order: title|tool|arguments of the full run|arguments of --quick.
# A tool with several commands has a line per command under one title. "routing" is the
# integration tests that put HAProxy and nginx in front of a cluster.
sections=(
    "Election|bench_election||--quick"
    "Crons|bench_cron||--quick"
    "Scale|bench_scale||--quick --only scale --no-peers"
    "Jobs|bench_jobs|--only throughput --peers --both-modes|--quick --only latency"
    "Jobs|bench_jobs|--only limit --both-modes|"
    "Jobs|bench_jobs|--quick --only latency|"
    "Placement|bench_placement||--quick"
    "Metrics|bench_metrics|--prometheus|--crons 2000 --settle-secs 10"
    "Routing|routing||"
    "Soak|soak|--minutes 30|--minutes 1"
)

pg_version() {
    local postgres
    postgres=$(command -v postgres || ls /usr/lib/postgresql/*/bin/postgres 2>/dev/null | sort -V | tail -1 || true)
    if [ -n "$postgres" ]; then "$postgres" --version | sed 's/.*) //'; else echo "unknown"; fi
}
cpu=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //' || echo "unknown CPU")
machine="$(nproc) cores ($cpu), $(free -g | awk '/^Mem:/ {print $2}') GB, $(uname -sr), PostgreSQL $(pg_version)"
today=$(date -u +%F)
mode="a full run"
[ "$quick" = 1 ] && mode="a quick run: each tool's quickest mode, figures not to compare"

wanted() { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; }

page=$(mktemp)
trap 'rm -f "$page"' EXIT
cat > "$page" <<EOF
# Benchmarks

The current figures, each with the command that prints it, the machine and the date. The
history of what was measured and tried, and why the code is as it is, is in
[experiments](experiments.md). Run them on your own hardware: on a shared VM figures move by
15-30 % between sessions, so compare only figures taken side by side.

\`docs/benchmarks.sh\` wrote this page ($mode): it ran every command below and wrote
each section with its command, the machine and the date, and the figures as the command printed
them.
The tools are the crate \`forge-tools\` (\`tools/\`, described in \`tools/README.md\`); each starts its
own throwaway PostgreSQL.

The machine: $machine.
EOF

title_done=""
for section in "${sections[@]}"; do
    IFS='|' read -r title tool full quick_args <<< "$section"
    wanted "$tool" || continue
    if [ "$quick" = 1 ]; then
        # One command per tool in a quick run: the first line of a tool with several.
        [[ " $title_done " == *" $tool "* ]] && continue
        args="$quick_args"
    else
        args="$full"
    fi
    if [ "$tool" = routing ]; then
        command=(cargo test -p forge-tests --test it -- routing:: --nocapture)
        shown="FORGE_REQUIRE_TOOLS=1 ${command[*]}"
    else
        # shellcheck disable=SC2206 # the arguments are words
        command=(cargo run --release -q -p forge-tools --bin "$tool" -- $args)
        shown="${command[*]}"
        shown="${shown% --}"
    fi
    echo "benchmarks.sh: $shown" >&2
    output=$(mktemp)
    status=0
    FORGE_REQUIRE_TOOLS=1 "${command[@]}" > "$output" || status=$?
    if [ "$status" != 0 ] && [ ! -s "$output" ]; then
        # Nothing printed: it did not build or run (a missed target still prints its figures).
        echo "benchmarks.sh: '$shown' failed (exit status $status) and printed nothing; $out is unchanged" >&2
        rm -f "$output"
        exit 1
    fi
    if [[ " $title_done " != *" $tool "* ]]; then
        printf '\n## %s\n' "$title" >> "$page"
        title_done="$title_done $tool"
    fi
    {
        printf '\n`%s` - %s\n\n' "$shown" "$today"
        [ "$status" = 0 ] || printf 'Exit status %s: a target was missed, or the run failed part-way.\n\n' "$status"
        printf '```text\n'
        cat "$output"
        printf '```\n'
    } >> "$page"
    rm -f "$output"
done

mv "$page" "$out"
trap - EXIT
echo "benchmarks.sh: wrote $out" >&2
