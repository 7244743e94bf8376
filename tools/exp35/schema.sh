#!/bin/bash
# Creates database DB on the server of URL with FORGE's schema at git revision REV (migrations in
# order, then the function files, as tools/job_writes.sh does), one node and its lane (so that
# today's forge.jobs_step claims), then the files FILE... of this folder (without .sql), in order.
# Extra psql options (-v hist_index=brin) in PSQL_VARS.
#
#   tools/exp35/schema.sh URL DB REV FILE...
set -euo pipefail
URL=$1; DB=$2; REV=$3; shift 3
ROOT=$(git rev-parse --show-toplevel)
HERE=$(dirname "$0")
PGOPTIONS="-c client_min_messages=warning" psql "$URL" -XAtq -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB" >/dev/null
{
  echo "CREATE SCHEMA forge;"
  for f in $(git -C "$ROOT" ls-tree --name-only "$REV" migrations/ | grep "\.sql$" | sort); do
    git -C "$ROOT" show "$REV:$f"; echo
  done
  echo "SET check_function_bodies = off;"
  for f in $(git -C "$ROOT" ls-tree --name-only "$REV" migrations/functions/ | sort); do
    git -C "$ROOT" show "$REV:$f"; echo
  done
  echo "RESET check_function_bodies;"
  echo "INSERT INTO forge.nodes (namespace, node_id, started_at, heartbeat_at)
        VALUES ('forge', 'writes', now(), now());
        INSERT INTO forge.job_lanes VALUES ('forge', 'writes', 'default', 1, 1, now());
        CREATE SCHEMA exp;"
  for f in "$@"; do cat "$HERE/$f.sql"; echo; done
} | PGOPTIONS='-c client_min_messages=warning' psql "${URL%/*}/$DB" -XAtq -v ON_ERROR_STOP=1 ${PSQL_VARS:-} >/dev/null
