"""Partitions and names shared by the assets, checks, jobs, schedule and sensor."""

import dagster as dg

#: Every asset is keyed to one UTC day of trips, never to the wall clock.
DAILY = dg.DailyPartitionsDefinition(start_date="2026-01-01", timezone="UTC")

#: Chunk size of a backfill for assets whose days are independent: a year is 12 runs, each
#: one transaction per asset, so the fixed cost of a run is paid a dozen times, not 365.
DAYS_PER_CHUNK = 31

CHUNKED = dg.BackfillPolicy.multi_run(max_partitions_per_run=DAYS_PER_CHUNK)

#: Concurrency pool of every asset that writes the warehouse file; dagster.yaml gives it one slot
#: because DuckDB allows a single writer process per database file.
WAREHOUSE_POOL = "duckdb_warehouse"

GROUP = "taxi"

#: Hours before the end of its day by which a complete file has seen its last pickup.
FRESHNESS_HOURS = 3
