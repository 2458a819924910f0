# Two commands set up a fresh machine: `make demo` and `make test`. Both create .venv if needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home

.PHONY: demo test test-fast test-full peer-suites dev lint bench clean browser-deps

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

test: $(STAMP) browser-deps postgres-deps java-deps
	bash scripts/run_tests.sh

# The reliability suite at full counts: 350 SIGKILLs, 1,000-publish soak, more examples; the
# Iceberg kills (20 per catalog), its races and whole conformance run on the PostgreSQL catalog;
# the tests marked full (the UI's first backfill of every partition, the printed bad-input
# command, daemon tests whose story make test proves through another test); 15 days of
# one-run-per-day backfills and 31 in parallel; Spark's 24 driver kills and
# the whole conformance suite on Spark; 10 races and 30 kills a day of Delta's staged files.
test-full: $(STAMP) browser-deps postgres-deps java-deps
	IDEM_FULL=1 $(BIN)/python -m pytest tests/reliability -q -p no:cacheprovider
	IDEM_FULL=1 $(BIN)/python -m pytest tests/delta/test_staged_files.py -q -p no:cacheprovider
	IDEM_FULL=1 $(BIN)/python -m pytest tests/iceberg tests/conformance -q -p no:cacheprovider -k iceberg -m "not full"
	IDEM_FULL=1 $(BIN)/python -m pytest tests/spark tests/conformance -q -p no:cacheprovider -k spark -m "not full"
	IDEM_FULL=1 $(BIN)/python -m pytest -m full -q -p no:cacheprovider
	IDEM_PARALLEL_DAYS=31 $(BIN)/python -m pytest tests/e2e/test_parallel_backfill.py -q -p no:cacheprovider
	IDEM_FULL=1 $(BIN)/python -m pytest tests/e2e/test_backfills.py -q -p no:cacheprovider

# Dagster's own DuckDB and Delta IO manager test suites at the installed versions, fetched with
# pip: as published against the peers (all must pass), then with ours swapped in (about 5
# minutes). make test-full runs it: tests/test_peer_suites.py is marked full.
peer-suites: $(STAMP)
	$(BIN)/python scripts/peer_suites.py --min-swapped 31

# Debian's Chromium for tests/browser; without root it prints the command and the tests skip.
browser-deps:
	bash scripts/install_browser.sh

# Debian's Java runtime for the Spark engine (pyspark 4 needs Java 17+); without root it prints
# the command and fails, as the Spark tests cannot run without it (docs/spark.md).
.PHONY: java-deps
java-deps:
	bash scripts/install_java.sh

# Debian's PostgreSQL server binaries for the tests that start a throwaway cluster (docs/postgres.md).
.PHONY: postgres-deps
postgres-deps:
	bash scripts/install_postgres.sh

# A landing file for every day of the partitions, and for today, whose file the next schedule
# tick loads; a day that already has one (such as `make demo`'s correction) keeps it.
dev-data: $(STAMP)
	$(BIN)/python -m idem_assets.landing generate --start 2026-01-01 --end today --rows 1000 --missing-only

dev: $(STAMP) $(DAGSTER_HOME)/dagster.yaml dev-data
	# dg dev is the successor of dagster dev (webserver + daemon); VIRTUAL_ENV tells dg which venv runs.
	VIRTUAL_ENV=$(CURDIR)/$(VENV) $(BIN)/dg dev --host 127.0.0.1 --port 3000

# Prints one table of medians and ratios and rewrites benchmarks/results.md's tables, keeping its
# sections on benchmarks run on their own (over an hour on 2 cores: benchmark 12 alone writes
# 2M- and 20M-row days on three engines in fresh processes).
bench: $(STAMP)
	$(BIN)/python -m benchmarks.run

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pyright

clean:
	rm -rf .data $(DAGSTER_HOME)

# Backfills (docs/backfills.md). The warehouse pool's one slot needs no setup step: the code
# location stores it when it loads (idem_assets/defs/pools.py).
.PHONY: dev-data test-backfills bench-backfills
test-backfills: $(STAMP)
	$(BIN)/python -m pytest tests/e2e/test_backfills.py -q -p no:cacheprovider -x -s

# Where a backfill's wall time goes (a day, 31 days, a year; three each; about 25 minutes):
# per-phase medians through the stock daemon. BENCH_ARGS="--cases day --repeat 1" for a quick look;
# benchmarks/backfill_wall_time.py compares one run per day with chunks. Then 31 days one run per
# day on the Postgres instance: the warehouse pool at 3 slots against 1, and DuckDB (about
# 10 minutes a round; PARALLEL_ARGS="--repeat 1").
bench-backfills: $(STAMP)
	$(BIN)/python benchmarks/backfill_phases.py $(BENCH_ARGS)
	$(BIN)/python benchmarks/parallel_backfill.py $(PARALLEL_ARGS)
