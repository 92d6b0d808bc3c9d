#!/usr/bin/env bash
# `make test`'s two runs side by side: the whole suite on SQLite, its output as it goes, and the
# database tests again on PostgreSQL, its output once both have ended. Most tests wait on other
# processes (Redis, Celery workers, web servers, Chromium), so the two together take little more
# than the longer one. Each run has its own Redis databases (and the PostgreSQL one no SQLite
# file), so that neither flushes the other's data. Arguments go to both pytest runs.
set -uo pipefail
cd "$(dirname "$0")/.."

PG_URL="${PG_TEST_URL:?the PostgreSQL database for the tests: make test sets PG_TEST_URL}"
PG_REDIS_URL="${GATEKEEPER_TEST_PG_REDIS_URL:-redis://127.0.0.1:6379/13}"
PG_BROKER_URL="${GATEKEEPER_TEST_PG_BROKER_URL:-redis://127.0.0.1:6379/12}"
mkdir -p var
log=var/test-postgres.log

DATABASE_URL="$PG_URL" GATEKEEPER_TEST_REDIS_URL="$PG_REDIS_URL" \
  GATEKEEPER_TEST_BROKER_URL="$PG_BROKER_URL" \
  .venv/bin/pytest -m database "$@" >"$log" 2>&1 &
postgres_pid=$!
trap 'kill "$postgres_pid" 2>/dev/null; exit 130' INT TERM

echo "The database tests run on PostgreSQL beside this run; their output follows it ($log)."
.venv/bin/pytest "$@"
sqlite=$?
echo
echo "SQLite run ended ($sqlite); waiting for the PostgreSQL run ..."
wait "$postgres_pid"
postgres=$?

echo
echo "=================================== PostgreSQL ==================================="
cat "$log"
echo
echo "SQLite run: $([ "$sqlite" -eq 0 ] && echo passed || echo "FAILED ($sqlite)");" \
  "PostgreSQL run: $([ "$postgres" -eq 0 ] && echo passed || echo "FAILED ($postgres)")"
[ "$sqlite" -eq 0 ] && [ "$postgres" -eq 0 ]
