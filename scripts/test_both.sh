#!/usr/bin/env bash
# `make test`'s two runs side by side: the whole suite on SQLite, spread over two processes
# (pytest-xdist; each its own Redis databases and SQLite file), its output as it goes, and the
# tests whose behaviour depends on the database (marked `postgres`, docs/testing.md) again on
# PostgreSQL, its output once both have ended. Each run has its own Redis databases (and the
# PostgreSQL one no SQLite file), so that neither flushes the other's data. Arguments go to both
# pytest runs. Ends by saying how long each took.
set -uo pipefail
cd "$(dirname "$0")/.."

PG_URL="${PG_TEST_URL:?the PostgreSQL database for the tests: make test sets PG_TEST_URL}"
PG_REDIS_URL="${GATEKEEPER_TEST_PG_REDIS_URL:-redis://127.0.0.1:6379/13}"
PG_BROKER_URL="${GATEKEEPER_TEST_PG_BROKER_URL:-redis://127.0.0.1:6379/12}"
PROCESSES="${GATEKEEPER_TEST_PROCESSES:-2}"
mkdir -p var
log=var/test-postgres.log
started=$(date +%s)

DATABASE_URL="$PG_URL" GATEKEEPER_TEST_REDIS_URL="$PG_REDIS_URL" \
  GATEKEEPER_TEST_BROKER_URL="$PG_BROKER_URL" \
  .venv/bin/pytest -m postgres "$@" >"$log" 2>&1 &
postgres_pid=$!
trap 'kill "$postgres_pid" 2>/dev/null; exit 130' INT TERM

echo "The PostgreSQL tests run beside this run; their output follows it ($log)."
.venv/bin/pytest -n "$PROCESSES" --dist worksteal "$@"
sqlite=$?
sqlite_took=$(($(date +%s) - started))
echo
echo "SQLite run ended ($sqlite) after ${sqlite_took} s; waiting for the PostgreSQL run ..."
wait "$postgres_pid"
postgres=$?
took=$(($(date +%s) - started))

echo
echo "=================================== PostgreSQL ==================================="
cat "$log"
echo
echo "SQLite run: $([ "$sqlite" -eq 0 ] && echo passed || echo "FAILED ($sqlite)") in ${sqlite_took} s;" \
  "PostgreSQL run: $([ "$postgres" -eq 0 ] && echo passed || echo "FAILED ($postgres)");" \
  "both in ${took} s ($((took / 60)) min $((took % 60)) s)"
[ "$sqlite" -eq 0 ] && [ "$postgres" -eq 0 ]
