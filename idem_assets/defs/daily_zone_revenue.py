"""daily_zone_revenue: trips and revenue per pickup zone per day."""

import dagster as dg
import duckdb
import pyarrow as pa

import idem_assets as ia
from idem_assets.defs.partitions import CHUNKED, DAILY, GROUP, WAREHOUSE_ENGINE, WAREHOUSE_POOL


def zone_revenue(trips: pa.Table) -> pa.Table:
    """Aggregate trips into one row per day and pickup zone, in a stable order."""
    con = duckdb.connect()
    try:
        con.register("trips", trips)
        return con.sql(
            """
            SELECT CAST(pickup_at AS DATE) AS day,
                   pickup_zone,
                   count(*) AS trips,
                   CAST(sum(passenger_count) AS BIGINT) AS passengers,
                   -- Decimal sums are exact, so the result never depends on the
                   -- order DuckDB's threads add the rows in.
                   sum(CAST(fare AS DECIMAL(18, 2))) AS fares,
                   sum(CAST(tip AS DECIMAL(18, 2))) AS tips,
                   sum(CAST(fare AS DECIMAL(18, 2)) + CAST(tip AS DECIMAL(18, 2))) AS revenue
            FROM trips
            GROUP BY ALL
            ORDER BY day, pickup_zone
            """
        ).to_arrow_table()
    finally:
        con.close()


@ia.audited_asset(
    partitions_def=DAILY,
    backfill_policy=CHUNKED,
    io_manager_key="overwrite_io_manager",
    metadata={"partition_expr": "day", "primary_key": ["day", "pickup_zone"]},
    checks=[ia.unique("day", "pickup_zone"), ia.between("revenue", 0, 10_000_000)],
    group_name=GROUP,
    kinds={WAREHOUSE_ENGINE},
    pool=WAREHOUSE_POOL,
)
def daily_zone_revenue(context: dg.AssetExecutionContext, trips: pa.Table) -> pa.Table:
    """Trips, passengers, fares, tips and revenue per pickup zone per day."""
    return zone_revenue(trips)
