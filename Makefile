# Gatekeeper. `make run` starts everything on embedded defaults; `make check` answers in minutes
# after a change; `make test` runs the whole suite, as CI does (docs/testing.md).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PG_TEST_URL ?= postgres://postgres@127.0.0.1:5432/test
PYTEST_ARGS ?=

.PHONY: run check test test-sqlite test-postgres lint format bench setup clean

setup: $(STAMP)

# Re-installs when a requirements file changes.
$(STAMP): requirements.txt requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python scripts/run.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy .
	$(BIN)/lint-imports --no-cache

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Lint, types, the floor order and every test that starts no process of its own (no server, no cluster, no
# browser), on SQLite and the machine's Redis, in three processes on the two cores (they wait on
# the live server and Redis now and then), with the app's lines covered.
CHECK_TESTS := not processes and not cluster
CHECK_PROCESSES ?= 3
check: $(STAMP)
	@start=$$(date +%s); \
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy . && \
	$(BIN)/lint-imports --no-cache && \
	$(BIN)/pytest -m "$(CHECK_TESTS)" -n $(CHECK_PROCESSES) --dist worksteal --hypothesis-profile=check \
	  --cov --cov-report=term:skip-covered --cov-fail-under=70 $(PYTEST_ARGS); \
	status=$$?; took=$$(( $$(date +%s) - start )); \
	echo "make check: $$([ $$status -eq 0 ] && echo passed || echo FAILED) in $$took s"; \
	exit $$status

# Everything on SQLite (over both cores) and, side by side with it, the tests whose behaviour
# depends on the database once more on PostgreSQL.
test: lint $(STAMP)
	$(BIN)/python scripts/system_deps.py
	PG_TEST_URL=$(PG_TEST_URL) scripts/test_both.sh $(PYTEST_ARGS)

# Either run alone.
test-sqlite: $(STAMP)
	$(BIN)/python scripts/system_deps.py
	$(BIN)/pytest -n 2 --dist worksteal $(PYTEST_ARGS)

test-postgres: $(STAMP)
	DATABASE_URL=$(PG_TEST_URL) $(BIN)/pytest -m postgres $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache .import_linter_cache .hypothesis .coverage .coverage.*
