"""daily_revenue_report: each day's revenue per zone, exported once per content through the outbox.

The export is a CSV file dropped into a folder that the finance team's importer watches. A rerun,
or a backfill over days already sent, exports nothing new: the outbox finds the same content in
its ledger and skips. A corrected day exports once more, as the next revision, and the file's
name carries the revision and the idempotency key, so a retried export rewrites the same file
instead of adding one.
"""

import csv
import io
import os
from pathlib import Path

import dagster as dg
import duckdb
import pyarrow as pa
from pydantic import Field

import idem_assets as ia
from idem_assets.defs.partitions import CHUNKED, DAILY, WAREHOUSE_POOL
from idem_assets.defs.warehouse import warehouse_path

REPORT_GROUP = "reports"
EXPORT_ACTION = "export_csv"


class ReportExport(dg.ConfigurableResource):
    """The folder the daily revenue reports are dropped into."""

    directory: str = Field(description="Export folder; one sub-folder per day.")

    def path_for(self, delivery: ia.Delivery) -> Path:
        """``<day>/daily_revenue_<day>_r<revision>_<key>.csv``: one file per revision."""
        day = delivery.partition
        return (
            Path(self.directory)
            / day
            / f"daily_revenue_{day}_r{delivery.revision}_{delivery.key}.csv"
        )

    def write(self, delivery: ia.Delivery, report: pa.Table) -> Path:
        """Write the report atomically; a repeat of the same key replaces the same file."""
        path = self.path_for(delivery)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".csv.tmp")
        tmp.write_text(report_csv(report))
        os.replace(tmp, path)
        return path


def report_table(daily_zone_revenue: pa.Table, day: str) -> pa.Table:
    """The day's rows of daily_zone_revenue, by zone, as the report carries them."""
    con = duckdb.connect()
    try:
        con.register("revenue", daily_zone_revenue)
        return con.sql(
            """
            SELECT pickup_zone, trips, passengers, fares, tips, revenue
            FROM revenue
            WHERE day = CAST(? AS DATE)
            ORDER BY pickup_zone
            """,
            params=[day],
        ).to_arrow_table()
    finally:
        con.close()


def report_csv(report: pa.Table) -> str:
    """The report as CSV text, decimals as written in the warehouse."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(report.column_names)
    for row in report.to_pylist():
        writer.writerow([str(v) for v in row.values()])
    return out.getvalue()


@dg.asset(
    partitions_def=DAILY,
    backfill_policy=CHUNKED,
    ins={"daily_zone_revenue": dg.AssetIn()},
    group_name=REPORT_GROUP,
    kinds={"csv"},
    # Its input is read from the warehouse, so it queues for the same slot(s) as the writers.
    pool=WAREHOUSE_POOL,
)
def daily_revenue_report(
    context: dg.AssetExecutionContext,
    daily_zone_revenue: pa.Table,
    outbox: ia.Outbox,
    report_export: ReportExport,
) -> dg.MaterializeResult:
    """The day's revenue per zone, exported as CSV once per content (a rerun sends nothing)."""
    outcomes = []
    for day in context.partition_keys:
        report = report_table(daily_zone_revenue, day)
        result = outbox.deliver(
            context,
            EXPORT_ACTION,
            report,
            lambda delivery, report=report: report_export.write(delivery, report),
            partition=day,
        )
        outcomes.append(result.outcome)
        context.add_asset_metadata(
            {
                **result.metadata,
                "zones": report.num_rows,
                "path": str(report_export.path_for(result.delivery)),
            },
            partition_key=day,
        )
    return dg.MaterializeResult(
        metadata={f"exports_{o}": outcomes.count(o) for o in ("performed", "retried", "skipped")}
    )


revenue_report_job = dg.define_asset_job(
    name="revenue_report",
    selection=dg.AssetSelection.assets(daily_revenue_report),
    description="Export each day's revenue report through the outbox (a rerun sends nothing).",
)

# An hour after taxi_daily's run for the same day.
revenue_report_schedule = dg.build_schedule_from_partitioned_job(
    revenue_report_job,
    hour_of_day=2,
    name="revenue_report_schedule",
    default_status=dg.DefaultScheduleStatus.STOPPED,
)


@dg.definitions
def report_definitions() -> dg.Definitions:
    """The report, its job and schedule; the outbox ledger and export folder by the warehouse."""
    # A module with a @dg.definitions function contributes only what that function returns.
    # Local files on either engine: the folder that holds (or would hold) the DuckDB file.
    data = Path(warehouse_path()).parent
    return dg.Definitions(
        assets=[daily_revenue_report],
        jobs=[revenue_report_job],
        schedules=[revenue_report_schedule],
        resources={
            "outbox": ia.Outbox(ledger=str(data / "outbox.sqlite")),
            "report_export": ReportExport(directory=str(data / "exports" / "daily_revenue")),
        },
    )
