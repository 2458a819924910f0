"""revenue_running_total: cumulative revenue, which depends on its own previous day.

Like Airflow's ``depends_on_past``, each day needs the day before. Rather than one run per day,
a run computes every day of its range in one pass, seeded by the total of the day before the
range; Dagster's self-dependency makes a backfill run oldest first.
"""

from datetime import date, timedelta
from decimal import Decimal

import dagster as dg
import duckdb
import pyarrow as pa

import idem_assets as ia
from idem_assets.defs.partitions import DAILY, GROUP, WAREHOUSE_POOL


def running_totals(
    days: list[date], daily_revenue: pa.Table, previous_total: Decimal | None
) -> pa.Table:
    """Revenue per day and the running total, starting from ``previous_total``.

    Days without trips get revenue 0, so every day of the range has a row.
    """
    con = duckdb.connect()
    try:
        con.register("daily_zone_revenue", daily_revenue)
        con.register("days", pa.table({"day": pa.array(days, pa.date32())}))
        return con.sql(
            """
            WITH per_day AS (
                SELECT d.day, coalesce(sum(r.revenue), 0)::DECIMAL(18, 2) AS revenue
                FROM days d LEFT JOIN daily_zone_revenue r ON r.day = d.day
                GROUP BY d.day
            )
            SELECT day,
                   revenue,
                   (CAST(? AS DECIMAL(18, 2))
                    + sum(revenue) OVER (ORDER BY day))::DECIMAL(18, 2) AS running_total
            FROM per_day
            ORDER BY day
            """,
            params=[str(previous_total or 0)],
        ).to_arrow_table()
    finally:
        con.close()


@ia.audited_asset(
    partitions_def=DAILY,
    # One run covers the whole range: each day is computed from the day before it in the same
    # pass, so the range needs neither one run per day nor a daemon tick per day.
    backfill_policy=dg.BackfillPolicy.single_run(),
    io_manager_key="overwrite_io_manager",
    metadata={"partition_expr": "day", "primary_key": ["day"]},
    ins={
        "daily_zone_revenue": dg.AssetIn(),
        "previous": dg.AssetIn(
            key="revenue_running_total",
            partition_mapping=dg.TimeWindowPartitionMapping(
                start_offset=-1, end_offset=-1, allow_nonexistent_upstream_partitions=True
            ),
        ),
    },
    checks=[ia.row_count(min_rows=1, max_rows=1, name="one_row_per_day"), ia.unique("day")],
    group_name=GROUP,
    kinds={"duckdb"},
    pool=WAREHOUSE_POOL,
)
def revenue_running_total(
    context: dg.AssetExecutionContext, daily_zone_revenue: pa.Table, previous: pa.Table
) -> pa.Table:
    """Revenue per day and its running total since the first partition."""
    days = [date.fromisoformat(k) for k in context.partition_keys]
    first = days[0]
    previous_total = None
    if context.partition_keys[0] != DAILY.get_first_partition_key():
        before = first - timedelta(days=1)
        totals = {row["day"]: row["running_total"] for row in previous.to_pylist()}
        if before not in totals:
            raise dg.Failure(
                f"revenue_running_total for {before} is missing, so the total from {first} on"
                f" cannot be computed. Materialize {before} first (a backfill from the first"
                " missing day runs in order, oldest first)."
            )
        previous_total = totals[before]
        context.log.info(f"Seeded with the running total of {before}: {previous_total:.2f}")
    return running_totals(days, daily_zone_revenue, previous_total)
