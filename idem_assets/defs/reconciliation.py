"""rows_reconcile_with_manifests: each loaded day of raw_trips holds the rows its manifest declares.

The audit checks each batch before it is published; this check looks at the warehouse afterwards,
across every day loaded so far, so a backfill that appended a day twice or lost part of one shows
up as a per-day delta (3 days of 1,000 rows must be 3,000 rows; 6,000 fails).
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import dagster as dg
import duckdb
import pyarrow as pa
import pyarrow.compute as pc

import idem_assets as ia
from idem_assets.defs.daily_zone_revenue import daily_zone_revenue
from idem_assets.defs.partitions import WAREHOUSE_POOL
from idem_assets.defs.raw_trips import raw_trips
from idem_assets.defs.resources import LandingZone
from idem_assets.defs.revenue_running_total import revenue_running_total
from idem_assets.defs.trips import trips
from idem_assets.landing import list_days, manifest_rows

RECONCILE_CHECK = "rows_reconcile_with_manifests"

Status = Literal["ok", "short", "doubled", "no_manifest"]
STATUSES: tuple[Status, ...] = ("ok", "short", "doubled", "no_manifest")


@dataclass(frozen=True)
class DayCount:
    """Rows of one day: what its manifest declares and what the warehouse holds."""

    day: str
    expected: int | None
    actual: int

    @property
    def delta(self) -> int | None:
        """Actual minus expected rows; None without a manifest."""
        return None if self.expected is None else self.actual - self.expected

    @property
    def status(self) -> Status:
        """``short`` below the manifest, ``doubled`` above it (e.g. appended twice)."""
        if self.delta is None:
            return "no_manifest"
        if self.delta < 0:
            return "short"
        return "doubled" if self.delta > 0 else "ok"


@dataclass(frozen=True)
class Reconciliation:
    """The per-day comparison of one table with the landing manifests."""

    days: list[DayCount]
    #: Days with a manifest that were never loaded; not a failure, a backfill may still be going.
    not_loaded: int

    @property
    def passed(self) -> bool:
        """True when every loaded day holds exactly its manifest's rows."""
        return all(d.status == "ok" for d in self.days)

    def counts(self) -> dict[Status, int]:
        """Days per status."""
        return {s: sum(d.status == s for d in self.days) for s in STATUSES}

    def markdown(self) -> str:
        """A table of day, expected, actual, delta and status, mismatches first."""
        lines = ["| day | expected | actual | delta | status |", "|---|---:|---:|---:|---|"]
        ordered = sorted(self.days, key=lambda d: (d.status == "ok", d.day))
        for d in ordered:
            expected = "-" if d.expected is None else f"{d.expected:,}"
            delta = "-" if d.delta is None else f"{d.delta:+,}"
            lines.append(f"| {d.day} | {expected} | {d.actual:,} | {delta} | {d.status} |")
        return "\n".join(lines)


def reconcile(
    actual: Mapping[str, int], expected: Mapping[str, int], materialized: Iterable[str] = ()
) -> Reconciliation:
    """Compare rows per day in the warehouse with the manifests.

    A day is in scope when the warehouse holds rows for it or Dagster recorded it as
    materialized (so a day that was published empty counts as short, not as not loaded).
    """
    loaded = set(actual) | set(materialized)
    days = [DayCount(day, expected.get(day), actual.get(day, 0)) for day in sorted(loaded)]
    return Reconciliation(days, not_loaded=len(set(expected) - loaded))


def rows_per_day(
    conn: duckdb.DuckDBPyConnection, schema: str, table: str, column: str
) -> dict[str, int]:
    """Rows per UTC day of ``column`` in a DuckDB ``schema.table``; empty without the table.

    The demo and the tests read a DuckDB warehouse file with it; the check itself reads through
    the IO manager (:func:`counts_per_day`), on either engine.
    """
    exists = conn.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = ? AND table_name = ?",
        [schema, table],
    ).fetchall()[0][0]
    if not exists:
        return {}
    # The daily partitions are UTC days and naive timestamps hold UTC wall-clock time.
    rows = conn.execute(
        f"SELECT CAST({ia.quote(column)} AS DATE), count(*)"
        f" FROM {ia.qualified(schema, table)} GROUP BY 1"
    ).fetchall()
    return {day.isoformat(): n for day, n in rows}


def counts_per_day(table: pa.Table, column: str) -> dict[str, int]:
    """Rows per UTC day of ``column`` in an Arrow table (naive timestamps hold UTC time)."""
    if not table.num_rows:
        return {}
    days = pc.cast(table.column(column), pa.date32())
    counts = pa.table({"day": days}).group_by("day").aggregate([("day", "count")])
    return {
        day.isoformat(): n
        for day, n in zip(
            counts.column("day").to_pylist(), counts.column("day_count").to_pylist(), strict=True
        )
    }


def manifest_counts(root: Path) -> dict[str, int]:
    """Rows each day's manifest declares, reading the manifests only."""
    return {day.isoformat(): manifest_rows(root, day) for day in list_days(root)}


def check_result(result: Reconciliation) -> dg.AssetCheckResult:
    """The check's verdict with per-day deltas in its metadata."""
    counts = result.counts()
    mismatched = {d.day: d for d in result.days if d.status != "ok"}
    return dg.AssetCheckResult(
        passed=result.passed,
        severity=dg.AssetCheckSeverity.WARN,
        description=(
            f"{counts['ok']} of {len(result.days)} loaded day(s) match their manifests"
            + (f"; {len(mismatched)} do not: {', '.join(sorted(mismatched))}" if mismatched else "")
        ),
        metadata={
            **{f"days_{status}": n for status, n in counts.items()},
            "days_not_loaded": result.not_loaded,
            "expected_rows": sum(d.expected or 0 for d in result.days),
            "actual_rows": sum(d.actual for d in result.days),
            "reconciliation": dg.MetadataValue.md(result.markdown()),
            # Same shape as the audit checks' per_partition, mismatches only.
            "per_partition": dg.MetadataValue.json(
                {
                    day: {"rows": d.actual, "expected": d.expected, "delta": d.delta}
                    for day, d in mismatched.items()
                }
            ),
        },
    )


@dg.asset_check(
    asset=raw_trips,
    name=RECONCILE_CHECK,
    blocking=False,
    # It reads the warehouse too, so it queues for the same slot(s) as the writers.
    pool=WAREHOUSE_POOL,
    # The pool serializes runs, not the steps inside one; ordering the check after every other
    # warehouse step its run holds keeps it from reading while trips (also right after raw_trips)
    # writes in a parallel step process.
    additional_deps=[trips, daily_zone_revenue, revenue_running_total],
    description=(
        "Rows per day in raw_trips equal each landing manifest's count, for every loaded day"
        " (short or doubled days fail, with per-day deltas)."
    ),
)
def rows_reconcile_with_manifests(
    context: dg.AssetCheckExecutionContext,
    landing: LandingZone,
    # The IO manager that writes raw_trips reads it, on whichever engine it is.
    overwrite_io_manager: dg.ResourceParam[ia.IdempotentIOManager],
) -> dg.AssetCheckResult:
    """Compare raw_trips' rows per day in the warehouse with the landing manifests."""
    partition_expr = raw_trips.metadata_by_key[raw_trips.key]["partition_expr"]
    actual = counts_per_day(overwrite_io_manager.read_asset(raw_trips), partition_expr)
    materialized = context.instance.get_materialized_partitions(raw_trips.key)
    result = reconcile(actual, manifest_counts(landing.path), materialized)
    context.log.info(
        f"{RECONCILE_CHECK}: {result.counts()} over {len(result.days)} loaded day(s),"
        f" {result.not_loaded} not loaded"
    )
    return check_result(result)
