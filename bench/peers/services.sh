#!/usr/bin/env bash
# Start / stop the throw-away Postgres and Redis of the peer benchmark (bench/peers/run.sh starts and stops them).
# Everything lives under $BENCH_TMP (default /tmp/peer); both listen on 127.0.0.1 only.
#   services.sh start   -> writes $BENCH_TMP/services.env (PG_PORT, REDIS_PORT, DATABASE_URL, REDIS_URL)
#   services.sh reset [DB] -> drops the benchmark databases (aegra, sa), creates DB (default aegra) empty, flushes Redis
#   services.sh stop    -> stops both by their pid files
# PG_BIN: Postgres's server binaries (default: the newest /usr/lib/postgresql/*/bin, else `pg_config --bindir`).
# NEED_REDIS=0 starts no Redis (only Aegra's redis modes use it; run.sh sets it). Run as root, the cluster belongs
# to the `postgres` user (initdb refuses root); otherwise to the user running it.
set -euo pipefail
BENCH_TMP=${BENCH_TMP:-/tmp/peer}
PG_BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
PG_BIN=${PG_BIN:-$(pg_config --bindir)}
NEED_REDIS=${NEED_REDIS:-1}
PGDATA=$BENCH_TMP/pgdata
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
as_pg() {  # run a command line as the cluster's owner
  if [ "$(id -u)" = 0 ]; then su postgres -c "$1"; else bash -c "$1"; fi
}
psql_c() { as_pg "$PG_BIN/psql -h 127.0.0.1 -p $PG_PORT -U postgres -qAtc '$1'" >/dev/null; }

start() {
  mkdir -p "$BENCH_TMP"
  if [ ! -s "$PGDATA/PG_VERSION" ]; then
    rm -rf "$PGDATA"; mkdir -p "$PGDATA"
    [ "$(id -u)" != 0 ] || chown postgres "$PGDATA"
    as_pg "$PG_BIN/initdb -D $PGDATA -U postgres --auth=trust -E UTF8 >/dev/null"
  fi
  PG_PORT=$(free_port)
  # max_connections: Aegra's pools (SQLAlchemy 10+20, LangGraph 5..20) fit easily in 200.
  as_pg "$PG_BIN/pg_ctl -D $PGDATA -l $PGDATA/server.log -w \
      -o \"-h 127.0.0.1 -p $PG_PORT -k $PGDATA -c max_connections=200 -c shared_buffers=256MB\" start >/dev/null"
  psql_c 'DROP DATABASE IF EXISTS aegra'
  psql_c 'CREATE DATABASE aegra'
  REDIS_PORT=""
  if [ "$NEED_REDIS" = 1 ]; then
    REDIS_PORT=$(free_port)
    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no --daemonize yes \
        --pidfile "$BENCH_TMP/redis.pid" --logfile "$BENCH_TMP/redis.log" --dir "$BENCH_TMP"
  fi
  cat > "$BENCH_TMP/services.env" <<EOT
PG_PORT=$PG_PORT
REDIS_PORT=$REDIS_PORT
DATABASE_URL=postgresql://postgres:postgres@127.0.0.1:$PG_PORT/aegra
REDIS_URL=redis://127.0.0.1:${REDIS_PORT:-6379}/0
PG_VERSION="$("$PG_BIN/postgres" --version)"
REDIS_VERSION="$([ -z "$REDIS_PORT" ] || redis-server --version | awk '{print $3}')"
EOT
  cat "$BENCH_TMP/services.env"
}

reset_db() {  # $1 = the database to create empty (aegra, or sa for our server); the other one is dropped
  . "$BENCH_TMP/services.env"
  local db
  for db in aegra sa; do psql_c "DROP DATABASE IF EXISTS $db WITH (FORCE)"; done
  psql_c "CREATE DATABASE ${1:-aegra}"
  [ -z "$REDIS_PORT" ] || redis-cli -h 127.0.0.1 -p "$REDIS_PORT" FLUSHALL >/dev/null
}

stop() {
  if [ -f "$BENCH_TMP/redis.pid" ]; then kill "$(cat "$BENCH_TMP/redis.pid")" 2>/dev/null || true; rm -f "$BENCH_TMP/redis.pid"; fi
  if [ -f "$PGDATA/postmaster.pid" ]; then as_pg "$PG_BIN/pg_ctl -D $PGDATA -m fast -w stop >/dev/null" || true; fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  reset) reset_db "${2:-aegra}" ;;
  *) echo "usage: $0 start|stop|reset [aegra|sa]" >&2; exit 2 ;;
esac
