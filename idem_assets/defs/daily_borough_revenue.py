"""daily_borough_revenue: trips and revenue per day and pickup borough, one partition per pair.

Partitioned by day and borough (a ``dg.MultiPartitionsDefinition``), so a run owns exactly its
(day, borough) partitions: the overwrite IO manager replaces those and refuses a row of another
day or borough. Its input is its days of ``trips`` (the date dimension maps to the same daily
partition of ``trips``); the boroughs come from the location's zone lookup (defs/zones.py).
"""

from collections.abc import Sequence
from datetime import date

import dagster as dg
import duckdb
import pyarrow as pa

import idem_assets as ia
from idem_assets.defs.partitions import (
    CHUNKED,
    DAILY_BY_BOROUGH,
    WAREHOUSE_ENGINE,
    WAREHOUSE_POOL,
)
from idem_assets.defs.zones import BOROUGH_OF_ZONE

BOROUGH_GROUP = "boroughs"
DATE_DIMENSION, BOROUGH_DIMENSION = "date", "borough"
#: Zones shown in a refusal.
SHOWN = 5


class UnknownZoneError(ia.IdempotencyError):
    """Trips were picked up in a zone the zone-to-borough lookup does not know."""


def window_cells(keys: Sequence[str]) -> pa.Table:
    """The run's (day, borough) partitions, one row each."""
    parsed = [DAILY_BY_BOROUGH.get_partition_key_from_str(k).keys_by_dimension for k in keys]
    return pa.table(
        {
            "day": pa.array([date.fromisoformat(p[DATE_DIMENSION]) for p in parsed], pa.date32()),
            "borough": pa.array([p[BOROUGH_DIMENSION] for p in parsed], pa.string()),
        }
    )


def zone_lookup() -> pa.Table:
    """BOROUGH_OF_ZONE as a table of pickup_zone and borough."""
    return pa.table(
        {
            "pickup_zone": pa.array(list(BOROUGH_OF_ZONE), pa.string()),
            "borough": pa.array(list(BOROUGH_OF_ZONE.values()), pa.string()),
        }
    )


def unknown_zones(con: duckdb.DuckDBPyConnection) -> list[tuple[str, int]]:
    """Pickup zones of the registered trips missing from the lookup, with their trip counts."""
    return con.sql(
        """
        SELECT t.pickup_zone, count(*) AS trips
        FROM trips t ANTI JOIN zones z ON z.pickup_zone = t.pickup_zone
        GROUP BY ALL
        ORDER BY trips DESC, t.pickup_zone
        """
    ).fetchall()


def refuse_unknown_zones(unknown: list[tuple[str, int]], partitions: str) -> None:
    """Refuse the run: leaving those trips out would break borough sums = day's revenue."""
    trips = sum(n for _, n in unknown)
    sample = "\n".join(f"    pickup_zone={zone!r}, trips={n}" for zone, n in unknown[:SHOWN])
    raise UnknownZoneError(
        f"Refused to write asset 'daily_borough_revenue', partition(s) {partitions}: {trips}"
        f" trip(s) were picked up in {len(unknown)} zone(s) the zone-to-borough lookup does not"
        " know, so their revenue would belong to no borough. Nothing was changed. Fix: add each"
        " zone with its borough (TLC's taxi_zone_lookup.csv) to BOROUGH_OF_ZONE in"
        f" idem_assets/defs/zones.py, then rerun. Sample:\n{sample}"
    )


def borough_revenue(trips: pa.Table, cells: pa.Table, partitions: str) -> pa.Table:
    """One row per (day, borough) of ``cells``: its trips' counts and exact decimal sums.

    A borough without trips that day gets zeros, so every partition holds exactly one row.
    """
    con = duckdb.connect()
    try:
        con.register("trips", trips)
        con.register("zones", zone_lookup())
        con.register("cells", cells)
        unknown = unknown_zones(con)
        if unknown:
            refuse_unknown_zones(unknown, partitions)
        return con.sql(
            """
            WITH per_borough AS (
                SELECT CAST(t.pickup_at AS DATE) AS day,
                       z.borough,
                       count(*) AS trips,
                       sum(t.passenger_count) AS passengers,
                       -- The casts of daily_zone_revenue, so both sum a day to the same cent.
                       sum(CAST(t.fare AS DECIMAL(18, 2))) AS fares,
                       sum(CAST(t.tip AS DECIMAL(18, 2))) AS tips,
                       sum(CAST(t.fare AS DECIMAL(18, 2)) + CAST(t.tip AS DECIMAL(18, 2)))
                           AS revenue
                FROM trips t JOIN zones z ON z.pickup_zone = t.pickup_zone
                GROUP BY ALL
            )
            SELECT c.day,
                   c.borough,
                   coalesce(p.trips, 0)::BIGINT AS trips,
                   coalesce(p.passengers, 0)::BIGINT AS passengers,
                   coalesce(p.fares, 0)::DECIMAL(18, 2) AS fares,
                   coalesce(p.tips, 0)::DECIMAL(18, 2) AS tips,
                   coalesce(p.revenue, 0)::DECIMAL(18, 2) AS revenue
            FROM cells c LEFT JOIN per_borough p ON p.day = c.day AND p.borough = c.borough
            ORDER BY c.day, c.borough
            """
        ).to_arrow_table()
    finally:
        con.close()


@dg.asset(
    partitions_def=DAILY_BY_BOROUGH,
    # A run of up to 31 partitions: a backfill of every borough over a range of days runs one
    # borough's days per run (Dagster chunks a multi-dimensional range along one dimension).
    backfill_policy=CHUNKED,
    io_manager_key="overwrite_io_manager",
    metadata={
        "partition_expr": {DATE_DIMENSION: "day", BOROUGH_DIMENSION: "borough"},
        "primary_key": ["day", "borough"],
    },
    ins={
        # Dagster infers this mapping too; spelt out, a (day, borough) partition reads that
        # one day of trips, and a range of days reads those days, never the whole table.
        "trips": dg.AssetIn(
            partition_mapping=dg.MultiToSingleDimensionPartitionMapping(
                partition_dimension_name=DATE_DIMENSION
            )
        )
    },
    group_name=BOROUGH_GROUP,
    kinds={WAREHOUSE_ENGINE},
    pool=WAREHOUSE_POOL,
)
def daily_borough_revenue(context: dg.AssetExecutionContext, trips: pa.Table) -> pa.Table:
    """Trips, passengers, fares, tips and revenue per pickup borough per day."""
    keys = list(context.partition_keys)
    shown = keys[0] if len(keys) == 1 else f"{keys[0]}...{keys[-1]} ({len(keys)})"
    cells = window_cells(keys)
    days = sorted(set(cells.column("day").to_pylist()))
    context.log.info(f"{shown}: {trips.num_rows} trip(s) read, of {len(days)} day(s)")
    return borough_revenue(trips, cells, shown)
