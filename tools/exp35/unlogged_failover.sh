#!/bin/bash
# What an UNLOGGED claims table holds after a crash of PostgreSQL and on a promoted standby:
# starts a throwaway primary and a streaming standby (initdb, pg_basebackup) on ports 55436 and
# 55437 under DIR (run as root: the servers run as user postgres), writes 40 claims and 100
# jobs, reads them on the standby, promotes it, crashes the old primary (immediate stop) and
# restarts it, then stops both.
#
#   tools/exp35/unlogged_failover.sh [DIR]
set -euo pipefail
DIR=${1:-/tmp/exp35-ha}
B=$(pg_config --bindir)
OPTS="-k $DIR -c listen_addresses=127.0.0.1 -c wal_level=replica"
mkdir -p "$DIR" && chown postgres "$DIR"
as_pg() { su postgres -c "$*"; }
as_pg "$B/initdb -D $DIR/p -A trust -U postgres >/dev/null"
as_pg "$B/pg_ctl -D $DIR/p -o '-p 55436 $OPTS' -l $DIR/p.log start -w >/dev/null"
trap 'as_pg "$B/pg_ctl -D $DIR/s stop -m fast" >/dev/null 2>&1; as_pg "$B/pg_ctl -D $DIR/p stop -m fast" >/dev/null 2>&1' EXIT
as_pg "$B/pg_basebackup -h 127.0.0.1 -p 55436 -U postgres -D $DIR/s -R -X stream >/dev/null"
as_pg "$B/pg_ctl -D $DIR/s -o '-p 55437 $OPTS' -l $DIR/s.log start -w >/dev/null"
P=postgresql://postgres@127.0.0.1:55436/postgres; S=postgresql://postgres@127.0.0.1:55437/postgres
psql $P -XAtq -c "CREATE UNLOGGED TABLE claims (job_id bigint PRIMARY KEY, node_id text)" \
  -c "CREATE TABLE jobs (id bigint PRIMARY KEY, state text)" \
  -c "INSERT INTO jobs SELECT g, 'available' FROM generate_series(1, 100) g" \
  -c "INSERT INTO claims SELECT g, 'node-a' FROM generate_series(1, 40) g"
sleep 1   # replay
echo "primary: $(psql $P -XAtc 'SELECT count(*) FROM claims') claims, $(psql $P -XAtc 'SELECT count(*) FROM jobs') jobs"
echo "standby in recovery, claims: $(psql $S -XAtc 'SELECT count(*) FROM claims' 2>&1 | head -1)"
as_pg "$B/pg_ctl -D $DIR/s promote -w >/dev/null"
echo "promoted standby: $(psql $S -XAtc 'SELECT count(*) FROM claims') claims, $(psql $S -XAtc 'SELECT count(*) FROM jobs') jobs"
as_pg "$B/pg_ctl -D $DIR/p stop -m immediate >/dev/null"
as_pg "$B/pg_ctl -D $DIR/p -o '-p 55436 $OPTS' -l $DIR/p.log start -w >/dev/null"
echo "old primary after a crash (immediate stop) and restart: $(psql $P -XAtc 'SELECT count(*) FROM claims') claims"
