"""Partitions and names shared by the assets, checks, jobs, schedule and sensor."""

import dagster as dg

from idem_assets.defs.warehouse import ENGINES, engine_name, warehouse_slots
from idem_assets.defs.zones import BOROUGHS

#: The first day of trips; `make dev` writes a landing file for every day from it to today.
FIRST_DAY = "2026-01-01"

#: Every asset is keyed to one UTC day of trips, never to the wall clock. The definition runs to
#: the last finished day, as a live feed's does. (Dagster 1.13's UI lists and plots partitions
#: newest first counting back from now, even past an ``end_date``, so the data reaches today.)
DAILY = dg.DailyPartitionsDefinition(start_date=FIRST_DAY, timezone="UTC")

#: One partition per borough of the feed's pickup zones (defs/zones.py).
BOROUGH = dg.StaticPartitionsDefinition(list(BOROUGHS))

#: A day's trips of one borough: the same daily partitions as every other asset, so Dagster maps
#: a (day, borough) partition to that day of a daily upstream.
DAILY_BY_BOROUGH = dg.MultiPartitionsDefinition({"date": DAILY, "borough": BOROUGH})

#: Chunk size of a backfill for assets whose days are independent: a year is 12 runs, each
#: one transaction per asset, so the fixed cost of a run is paid a dozen times, not 365.
DAYS_PER_CHUNK = 31

CHUNKED = dg.BackfillPolicy.multi_run(max_partitions_per_run=DAYS_PER_CHUNK)

#: The warehouse engine (IDEM_WAREHOUSE, defs/warehouse.py), also the assets' kind in the UI.
WAREHOUSE_ENGINE = engine_name()

#: Concurrency pool of every asset and check that reads or writes the warehouse.
WAREHOUSE_POOL = f"{WAREHOUSE_ENGINE}_warehouse"

#: One slot on DuckDB (one writer process per file); 3 on PostgreSQL and Delta Lake, or
#: IDEM_WAREHOUSE_SLOTS.
WAREHOUSE_SLOTS = warehouse_slots()

#: Why the pool exists, shown in the UI with the job that the schedule, sensor and backfills run.
WAREHOUSE_POOL_REASON = (
    f"Pool {WAREHOUSE_POOL!r} has {WAREHOUSE_SLOTS} slot(s):"
    f" {ENGINES[WAREHOUSE_ENGINE].pool_reason}"
)

GROUP = "taxi"

#: Hours before the end of its day by which a complete file has seen its last pickup.
FRESHNESS_HOURS = 3
