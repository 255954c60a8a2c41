#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests that need one (tests/search/test_postgres.py).
#   url=$(bash scripts/postgres_for_tests.sh start)   # prints the database URL
#   AUTOTUNER_TEST_POSTGRES=$url bash scripts/test.sh -k postgres
#   bash scripts/postgres_for_tests.sh stop            # stops it and deletes its files
# The cluster lives in PGTEST_DIR (default /tmp/autotuner-pg-PORT), listens on 127.0.0.1 only at
# PGTEST_PORT (default 54329), trusts local connections and skips fsync: test data only. As root,
# the server runs as the `postgres` user (it refuses to run as root).
set -euo pipefail
PORT=${PGTEST_PORT:-54329}
DIR=${PGTEST_DIR:-/tmp/autotuner-pg-$PORT}
DB=optuna

bin_dir() {
    if command -v pg_ctl >/dev/null && command -v initdb >/dev/null; then
        dirname "$(readlink -f "$(command -v initdb)")"  # /usr/local/bin holds links only
        return
    fi
    local found
    found=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    [ -n "$found" ] || { echo "no PostgreSQL server installed (initdb, pg_ctl)" >&2; exit 1; }
    echo "$found"
}

as_owner() {  # run a server command as the cluster's owner
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

start() {
    local bin
    bin=$(bin_dir)
    if [ -f "$DIR/postmaster.pid" ]; then
        echo "a server already runs from $DIR: stop it first" >&2
        exit 1
    fi
    rm -rf "$DIR" && mkdir -p "$DIR"
    [ "$(id -u)" = 0 ] && chown postgres: "$DIR"
    as_owner "$bin/initdb" -D "$DIR/data" -U postgres --auth=trust -E UTF8 --no-sync >"$DIR/initdb.log"
    as_owner "$bin/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w -t 60 start \
        -o "-p $PORT -c listen_addresses=127.0.0.1 -k $DIR -c fsync=off" >&2
    as_owner "$bin/createdb" -h 127.0.0.1 -p "$PORT" -U postgres "$DB"
    echo "postgresql://postgres@127.0.0.1:$PORT/$DB"
}

stop() {
    [ -d "$DIR/data" ] || return 0
    as_owner "$(bin_dir)/pg_ctl" -D "$DIR/data" -m fast -w stop >&2 || true
    rm -rf "$DIR"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
