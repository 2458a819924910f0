"""revenue_running_total: each day's revenue and the total of every day up to it.

A day's total is the sum of ``daily_zone_revenue`` over every day up to and including it, read
from the warehouse, never the day before's stored total. So the asset depends on its upstream
alone, not on itself: Dagster runs it in the same run as its upstream chunk, days may be written
in any order and in parallel, and a wrong stored total never propagates to later days. What it
needs is every earlier day's revenue published before it reads; :func:`wait_for_earlier_writers`
waits for runs in progress that are still writing an earlier day.
"""

import time
from collections.abc import Callable
from datetime import date, timedelta
from decimal import Decimal

import dagster as dg
import duckdb
import pyarrow as pa

import idem_assets as ia

# Aliased: the asset function's input of the same name is the run's own days of it.
from idem_assets.defs.daily_zone_revenue import daily_zone_revenue as zone_revenue
from idem_assets.defs.partitions import (
    CHUNKED,
    DAILY,
    FIRST_DAY,
    GROUP,
    WAREHOUSE_ENGINE,
    WAREHOUSE_POOL,
)

RANGE_START = "dagster/asset_partition_range_start"

#: Runs that hold a slot and may still publish daily_zone_revenue (a queued run holds none, so
#: waiting for one could wait for ever behind this very run).
IN_FLIGHT = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]

#: How long a run waits for earlier days to be published before it fails.
WAIT_LIMIT_S = 1800.0
POLL_S = 0.5


def running_totals(days: list[date], daily_revenue: pa.Table, revenue_before: Decimal) -> pa.Table:
    """Revenue per day and the running total, adding ``revenue_before`` (the earlier days).

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
            params=[str(revenue_before)],
        ).to_arrow_table()
    finally:
        con.close()


def days_before(first: str) -> list[str]:
    """Every partition key before ``first``."""
    if first <= FIRST_DAY:
        return []
    last = (date.fromisoformat(first) - timedelta(days=1)).isoformat()
    return list(DAILY.get_partition_keys_in_range(dg.PartitionKeyRange(FIRST_DAY, last)))


def first_day_of(run: dg.DagsterRun) -> str | None:
    """The earliest day a run covers: its partition, or the start of its range."""
    return run.tags.get("dagster/partition") or run.tags.get(RANGE_START)


def writes_revenue(run: dg.DagsterRun) -> bool:
    """Whether a run may write daily_zone_revenue (a run of a whole job names no selection)."""
    return run.asset_selection is None or zone_revenue.key in run.asset_selection


def has_published_revenue(instance: dg.DagsterInstance, run_id: str) -> bool:
    """Whether a run has recorded a materialization of daily_zone_revenue."""
    records = instance.get_records_for_run(
        run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
    ).records
    return any(r.asset_key == zone_revenue.key for r in records)


def earlier_writers(instance: dg.DagsterInstance, run_id: str, first: str) -> list[str]:
    """Runs in progress, other than ``run_id``, still to publish revenue for a day before ``first``.

    Only a run that starts earlier can hold an earlier day, so two runs never wait for each
    other; a run that starts on the same day writes no day this one reads.
    """
    waiting = []
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=IN_FLIGHT)):
        start = first_day_of(run)
        if run.run_id == run_id or start is None or start >= first or not writes_revenue(run):
            continue
        if not has_published_revenue(instance, run.run_id):
            waiting.append(run.run_id)
    return sorted(waiting)


def wait_for_earlier_writers(
    context: dg.AssetExecutionContext,
    first: str,
    limit_s: float = WAIT_LIMIT_S,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Wait until no run in progress is still to publish an earlier day's revenue.

    Only where pools hold a slot for a whole run (``granularity: run``, as dagster.yaml sets):
    with ``op`` granularity this step would hold a slot that the earlier run's steps need.
    """
    granularity = context.instance.get_concurrency_config().pool_config.pool_granularity
    if granularity is None or granularity.value != "run":
        return
    deadline = time.monotonic() + limit_s
    logged: list[str] = []
    while waiting := earlier_writers(context.instance, context.run.run_id, first):
        if waiting != logged:
            context.log.info(
                f"Waiting for run(s) {', '.join(waiting)} to publish daily_zone_revenue for"
                f" days before {first}: this day's total adds their revenue."
            )
            logged = waiting
        if time.monotonic() > deadline:
            raise dg.Failure(
                f"revenue_running_total from {first}: run(s) {', '.join(waiting)} are still in"
                f" progress and have not published daily_zone_revenue for days before {first}"
                f" after {limit_s:.0f} s, so the total would miss their revenue. Nothing of"
                " revenue_running_total was changed. Fix: let them finish (or terminate them"
                f" from the UI if their worker died), then rerun {first}."
            )
        sleep(POLL_S)


def revenue_before(
    context: dg.AssetExecutionContext, first: str, warehouse: ia.IdempotentIOManager
) -> Decimal:
    """The revenue of every day before ``first``, as the warehouse holds it now.

    Refuses when an earlier day was never materialized: its revenue would silently count as 0
    in every total from ``first`` on.
    """
    keys = days_before(first)
    if not keys:
        return Decimal(0)
    history = warehouse.read_asset(zone_revenue, keys)
    with_rows = (
        {d.isoformat() for d in history.column("day").to_pylist()} if history.num_rows else set()
    )
    materialized = context.instance.get_materialized_partitions(zone_revenue.key)
    missing = [k for k in keys if k not in materialized and k not in with_rows]
    if missing:
        shown = missing[:10] + ([f"... ({len(missing)} in all)"] if len(missing) > 10 else [])
        raise ia.MissingUpstreamError(
            f"Refused to write asset 'revenue_running_total', partition(s) from {first}:"
            f" daily_zone_revenue was never materialized for {len(missing)} earlier day(s)"
            f" {shown}, so their revenue would count as 0 in every total from {first} on."
            " Nothing was changed. Fix: materialize the taxi group for"
            f" {missing[0]}...{missing[-1]} first (a backfill of that range), then rerun"
            f" {first}."
        )
    return sum(history.column("revenue").to_pylist() if history.num_rows else [], Decimal(0))


@ia.audited_asset(
    partitions_def=DAILY,
    # The upstream's policy: Dagster's asset backfill puts an asset in its parent's run only
    # when both have the same policy and a same-day mapping, so a chunk computes its totals too.
    backfill_policy=CHUNKED,
    io_manager_key="overwrite_io_manager",
    metadata={"partition_expr": "day", "primary_key": ["day"]},
    ins={"daily_zone_revenue": dg.AssetIn()},
    checks=[ia.row_count(min_rows=1, max_rows=1, name="one_row_per_day"), ia.unique("day")],
    group_name=GROUP,
    kinds={WAREHOUSE_ENGINE},
    pool=WAREHOUSE_POOL,
)
def revenue_running_total(
    context: dg.AssetExecutionContext,
    daily_zone_revenue: pa.Table,
    # The IO manager that writes daily_zone_revenue reads the earlier days from the warehouse.
    overwrite_io_manager: dg.ResourceParam[ia.IdempotentIOManager],
) -> pa.Table:
    """Revenue per day and the total of every day up to it since the first partition."""
    first = context.partition_keys[0]
    wait_for_earlier_writers(context, first)
    before = revenue_before(context, first, overwrite_io_manager)
    context.log.info(f"Revenue of the {len(days_before(first))} day(s) before {first}: {before}")
    days = [date.fromisoformat(k) for k in context.partition_keys]
    return running_totals(days, daily_zone_revenue, before)
