# Gatekeeper. `make run` starts everything on embedded defaults; `make test` runs the suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PG_TEST_URL ?= postgres://postgres@127.0.0.1:5432/test
PYTEST_ARGS ?=

.PHONY: run test test-sqlite test-postgres lint format bench setup clean

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

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# Everything on SQLite and, side by side with it, the database tests once more on PostgreSQL.
test: lint $(STAMP)
	$(BIN)/python scripts/system_deps.py
	PG_TEST_URL=$(PG_TEST_URL) scripts/test_both.sh $(PYTEST_ARGS)

# Either run alone.
test-sqlite: $(STAMP)
	$(BIN)/python scripts/system_deps.py
	$(BIN)/pytest $(PYTEST_ARGS)

test-postgres: $(STAMP)
	DATABASE_URL=$(PG_TEST_URL) $(BIN)/pytest -m database $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache .hypothesis
