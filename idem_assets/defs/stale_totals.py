"""totals_match_revenue: every stored running total equals the revenue of the days up to it.

A rerun of day D with a late or corrected file changes D's revenue, and with it the true total of
every later day; their stored totals were summed before and are stale until recomputed. This
check compares each stored total with the sum of daily_zone_revenue up to its day, after every run
that writes totals, and names the days to recompute (the late-file sensor requests them for a
changed landing file).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import dagster as dg
import pyarrow as pa

import idem_assets as ia
from idem_assets.defs.daily_zone_revenue import daily_zone_revenue
from idem_assets.defs.partitions import WAREHOUSE_POOL
from idem_assets.defs.revenue_running_total import revenue_running_total

TOTALS_CHECK = "totals_match_revenue"


@dataclass(frozen=True)
class StaleTotal:
    """A day whose stored running total differs from the revenue summed up to it."""

    day: str
    stored: Decimal
    expected: Decimal


def revenue_per_day(zone_revenue: pa.Table) -> dict[str, Decimal]:
    """daily_zone_revenue's rows summed per day."""
    per_day: dict[str, Decimal] = {}
    if zone_revenue.num_rows:
        for day, revenue in zip(
            zone_revenue.column("day").to_pylist(),
            zone_revenue.column("revenue").to_pylist(),
            strict=True,
        ):
            per_day[day.isoformat()] = per_day.get(day.isoformat(), Decimal(0)) + revenue
    return per_day


def stored_totals(totals: pa.Table) -> dict[str, Decimal]:
    """revenue_running_total's stored total per day."""
    if not totals.num_rows:
        return {}
    days = [d.isoformat() for d in totals.column("day").to_pylist()]
    return dict(zip(days, totals.column("running_total").to_pylist(), strict=True))


def stale_totals(stored: Mapping[str, Decimal], revenue: Mapping[str, Decimal]) -> list[StaleTotal]:
    """Days whose stored total is not the sum of revenue of every day up to it, oldest first."""
    stale, running = [], Decimal(0)
    for day in sorted(set(stored) | set(revenue)):
        running += revenue.get(day, Decimal(0))
        if day in stored and stored[day] != running:
            stale.append(StaleTotal(day, stored[day], running))
    return stale


def check_result(stale: list[StaleTotal], days: int) -> dg.AssetCheckResult:
    """The verdict, with the stale days and the range to recompute."""
    metadata: dict[str, Any] = {"days_checked": days, "days_stale": len(stale)}
    if not stale:
        return dg.AssetCheckResult(
            passed=True,
            severity=dg.AssetCheckSeverity.WARN,
            description=f"All {days} stored total(s) equal the revenue summed up to their day.",
            metadata=metadata,
        )
    first, last = stale[0].day, stale[-1].day
    metadata["stale"] = dg.MetadataValue.json(
        {
            s.day: {"stored": str(s.stored), "expected": str(s.expected)}
            for s in stale[:50]  # a sample: the range says the rest
        }
    )
    metadata["recompute"] = f"{first}...{last}"
    return dg.AssetCheckResult(
        passed=False,
        severity=dg.AssetCheckSeverity.WARN,
        description=(
            f"{len(stale)} of {days} stored total(s) are stale, from {first} to {last}: an"
            " earlier day's revenue changed after they were summed (e.g. a rerun with a late"
            f" file). Fix: recompute revenue_running_total for {first}...{last} (the late-file"
            " sensor requests it for a changed landing file; by hand, Assets →"
            f" revenue_running_total → Materialize → {first} to {last})."
        ),
        metadata=metadata,
    )


@dg.asset_check(
    asset=revenue_running_total,
    name=TOTALS_CHECK,
    blocking=False,
    # It reads the warehouse, so it queues for the same slot(s) as the writers.
    pool=WAREHOUSE_POOL,
    description=(
        "Every stored running total equals daily_zone_revenue summed up to its day; a rerun of"
        " an earlier day with other revenue makes the later totals stale, and this names them."
    ),
)
def totals_match_revenue(
    overwrite_io_manager: dg.ResourceParam[ia.IdempotentIOManager],
) -> dg.AssetCheckResult:
    """Compare every stored total with the revenue summed up to its day."""
    stored = stored_totals(overwrite_io_manager.read_asset(revenue_running_total))
    revenue = revenue_per_day(overwrite_io_manager.read_asset(daily_zone_revenue))
    return check_result(stale_totals(stored, revenue), len(stored))
