"""Partitions and names shared by the assets, checks, jobs, schedule and sensor."""

import dagster as dg

#: The first day of trips; `make dev` writes a landing file for every day from it to today.
FIRST_DAY = "2026-01-01"

#: Every asset is keyed to one UTC day of trips, never to the wall clock. The definition runs to
#: the last finished day, as a live feed's does. (Dagster 1.13's UI lists and plots partitions
#: newest first counting back from now, even past an ``end_date``, so the data reaches today.)
DAILY = dg.DailyPartitionsDefinition(start_date=FIRST_DAY, timezone="UTC")

#: Chunk size of a backfill for assets whose days are independent: a year is 12 runs, each
#: one transaction per asset, so the fixed cost of a run is paid a dozen times, not 365.
DAYS_PER_CHUNK = 31

CHUNKED = dg.BackfillPolicy.multi_run(max_partitions_per_run=DAYS_PER_CHUNK)

#: Concurrency pool of every asset that writes the warehouse file.
WAREHOUSE_POOL = "duckdb_warehouse"

#: One slot, because DuckDB lets one process at a time hold the file open for writing.
WAREHOUSE_SLOTS = 1

#: Why the pool exists, shown in the UI with the job that the schedule, sensor and backfills run.
WAREHOUSE_POOL_REASON = (
    f"Pool {WAREHOUSE_POOL!r} has {WAREHOUSE_SLOTS} slot: DuckDB lets one process at a time open"
    " the warehouse file for writing, so runs that write it wait in the queue, oldest first,"
    " instead of failing on the file lock."
)

GROUP = "taxi"

#: Hours before the end of its day by which a complete file has seen its last pickup.
FRESHNESS_HOURS = 3
