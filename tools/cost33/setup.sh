#!/bin/bash
# Database DB on the server of URL with FORGE's schema at git revision REV (tools/exp35/schema.sh:
# one node and its lane, exp.step of tools/exp35/today.sql), then EXTRA_SQL if set (a variant),
# then JOBS jobs of queue 'default' enqueued by the revision's forge.jobs_enqueue, analyzed,
# checkpointed. Used by counters.sh and callgrind.sh.
#
#   tools/cost33/setup.sh URL DB REV JOBS
set -euo pipefail
URL=$1; DB=$2; REV=$3; N=$4
HERE=$(cd "$(dirname "$0")" && pwd)
"$HERE/../exp35/schema.sh" "$URL" "$DB" "$REV" today
q() { psql "${URL%/*}/$DB" -XAtq -v ON_ERROR_STOP=1 "$@"; }
[ -n "${EXTRA_SQL:-}" ] && q -c "$EXTRA_SQL" >/dev/null
# The enqueue's arguments: 12 before unique options (3e09348), 13 since.
NARGS=$(q -c "SELECT pronargs FROM pg_proc WHERE proname = 'jobs_enqueue'")
EXTRA=""; [ "$NARGS" -ge 13 ] && EXTRA=", array_fill(NULL::jsonb, ARRAY[1000])"
q >/dev/null <<SQL
DO \$\$
BEGIN
  FOR g IN 1..$N / 1000 LOOP
    PERFORM forge.jobs_enqueue('forge', array_fill('default'::text, ARRAY[1000]),
      array_fill('noop'::text, ARRAY[1000]), array_fill('null'::jsonb, ARRAY[1000]),
      array_fill(0::smallint, ARRAY[1000]), array_fill(NULL::timestamptz, ARRAY[1000]),
      array_fill(NULL::bigint, ARRAY[1000]), array_fill(NULL::integer, ARRAY[1000]),
      array_fill(NULL::bigint, ARRAY[1000]), array_fill(NULL::text, ARRAY[1000]),
      array_fill(NULL::text, ARRAY[1000]), array_fill(false, ARRAY[1000])$EXTRA);
    COMMIT;
  END LOOP;
END
\$\$;
ANALYZE forge.jobs;
CHECKPOINT;
SQL
