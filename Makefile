# Two commands set up a fresh machine: `make demo` and `make test`. Both create .venv if needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: demo test test-fast dev lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

$(DAGSTER_HOME)/dagster.yaml: dagster.yaml
	mkdir -p $(DAGSTER_HOME)
	cp dagster.yaml $(DAGSTER_HOME)/dagster.yaml

demo: $(STAMP) $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/python -m idem_assets.demo

test: $(STAMP)
	bash scripts/run_tests.sh

dev: $(STAMP) $(DAGSTER_HOME)/dagster.yaml
	test -d .data/landing/trips || $(BIN)/python -m idem_assets.landing generate --start 2026-01-01 --end 2026-01-31 --rows 1000
	$(BIN)/dagster dev -h 127.0.0.1 -p 3000

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pyright

clean:
	rm -rf .data $(DAGSTER_HOME)
