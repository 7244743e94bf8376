#!/bin/bash
# How many session advisory locks the server's lock table holds, and what happens to everyone
# else while it is full. One session takes pg_advisory_lock(1), (2), ... until PostgreSQL says
# "out of shared memory", holds them 5 s, and meanwhile a new connection is tried. The whole
# server refuses new connections while the table is full: run it on a server of your own only.
#
#   tools/exp35/locks_full.sh URL
set -euo pipefail
URL=$1
psql "$URL" -XAt -c "SELECT 'max_locks_per_transaction ' || current_setting('max_locks_per_transaction')
                      || ', max_connections ' || current_setting('max_connections')
                      || ', max_prepared_transactions ' || current_setting('max_prepared_transactions')"
psql "$URL" -XAtq -c "CREATE TABLE IF NOT EXISTS exp35_locks_full (a int)"
# A session opened before the table fills: a statement on a table, then one on none.
( sleep 3; echo "SELECT 'a session opened before: a count of a table: ' || count(*) FROM exp35_locks_full;"
  echo "SELECT 'a session opened before: SELECT 1: ' || 1;" ) | psql "$URL" -XAt 2>&1 | head -3 &
psql "$URL" -XAtq <<'SQL' &
DO $$
DECLARE i bigint := 0;
BEGIN
  LOOP i := i + 1; PERFORM pg_advisory_lock(i); END LOOP;
EXCEPTION WHEN out_of_memory THEN
  RAISE NOTICE 'session advisory locks held when the lock table was full: %', i - 1;
END $$;
SELECT pg_sleep(5);
SQL
sleep 3
echo "a new connection meanwhile: $(psql "$URL" -XAtc "SELECT 'connected'" 2>&1 | head -1)"
wait
echo "after the session ended: $(psql "$URL" -XAtc "SELECT 'connected'" 2>&1 | head -1)"
psql "$URL" -XAtq -c "DROP TABLE exp35_locks_full"
