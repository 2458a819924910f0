"""revenue_running_total sums the revenue of every day up to its own; stale totals are named."""

from decimal import Decimal

import dagster as dg
import pytest

from idem_assets import landing
from idem_assets.defs.revenue_running_total import earlier_writers
from idem_assets.defs.stale_totals import TOTALS_CHECK

from .support import Pipeline, check_evaluations, d, days

DAYS = days("2026-01-01", "2026-01-04")
TOTALS = ("revenue_running_total", TOTALS_CHECK)


def revenue(pipeline: Pipeline) -> dict[str, Decimal]:
    """Each day's revenue as daily_zone_revenue holds it now."""
    return dict(
        pipeline.query(
            "SELECT day::VARCHAR, sum(revenue) FROM daily_zone_revenue GROUP BY 1 ORDER BY 1"
        )
    )


def cumulative(per_day: dict[str, Decimal]) -> dict[str, Decimal]:
    """The running total of ``per_day``, oldest first."""
    out, running = {}, Decimal(0)
    for day in sorted(per_day):
        running += per_day[day]
        out[day] = running
    return out


def totals(pipeline: Pipeline) -> dict[str, Decimal]:
    """The stored running total per day."""
    return dict(pipeline.query("SELECT day::VARCHAR, running_total FROM revenue_running_total"))


def test_a_late_file_for_an_old_day_flags_later_totals_stale_until_recomputed(
    pipeline: Pipeline,
) -> None:
    pipeline.generate(DAYS[0], DAYS[-1])
    first = pipeline.run_ok(DAYS[0], DAYS[-1])
    assert check_evaluations(first)[TOTALS].passed
    old = totals(pipeline)
    assert old == cumulative(revenue(pipeline))

    landing.correct(pipeline.root, d(DAYS[1]))
    rerun = pipeline.run_ok(DAYS[1])

    new = cumulative(revenue(pipeline))
    assert new[DAYS[1]] != old[DAYS[1]]
    # The rerun day's total is right; the later days still hold totals summed before.
    assert totals(pipeline) == {**old, DAYS[1]: new[DAYS[1]]}
    verdict = check_evaluations(rerun)[TOTALS]
    assert not verdict.passed
    md = {k: v.value for k, v in verdict.metadata.items()}
    assert md["days_checked"] == 4
    assert md["days_stale"] == 2
    assert md["recompute"] == f"{DAYS[2]}...{DAYS[3]}"
    assert md["stale"] == {
        day: {"stored": str(old[day]), "expected": str(new[day])} for day in DAYS[2:]
    }
    assert verdict.description.startswith(
        f"2 of 4 stored total(s) are stale, from {DAYS[2]} to {DAYS[3]}"
    )

    recompute = pipeline.run_ok(DAYS[2], DAYS[3], assets=["revenue_running_total"])

    assert check_evaluations(recompute)[TOTALS].passed
    assert totals(pipeline) == new


def test_a_day_total_adds_the_revenue_before_it_not_the_stored_total_before_it(
    pipeline: Pipeline,
) -> None:
    pipeline.generate(DAYS[0], DAYS[-1])
    pipeline.run_ok(DAYS[0], DAYS[-1])
    old = totals(pipeline)
    landing.correct(pipeline.root, d(DAYS[1]))
    # Day 2's revenue changes and its stored total is not recomputed, so it is stale.
    pipeline.run_ok(DAYS[1], assets=["raw_trips", "trips", "daily_zone_revenue"])

    result = pipeline.run_ok(DAYS[2])

    new = cumulative(revenue(pipeline))
    # Day 3 is right although the stored total before it is wrong: nothing stale propagates.
    assert totals(pipeline) == {**old, DAYS[2]: new[DAYS[2]]}
    assert new[DAYS[2]] != old[DAYS[2]]
    md = {k: v.value for k, v in check_evaluations(result)[TOTALS].metadata.items()}
    assert sorted(md["stale"]) == [DAYS[1], DAYS[3]]


def add_run(
    instance: dg.DagsterInstance,
    status: dg.DagsterRunStatus,
    tags: dict[str, str],
    assets: list[str] | None = None,
) -> str:
    """Record a run of taxi_daily in the instance, as the run queue would hold it."""
    run = dg.DagsterRun(
        job_name="taxi_daily",
        status=status,
        tags=tags,
        asset_selection=frozenset(dg.AssetKey(a) for a in assets) if assets else None,
    )
    instance.add_run(run)
    return run.run_id


@pytest.mark.parametrize(
    ("status", "tags", "assets", "waits"),
    [
        ("STARTED", {"dagster/partition": "2026-01-01"}, None, True),
        ("STARTING", {"dagster/partition": "2026-01-01"}, ["daily_zone_revenue"], True),
        (
            "STARTED",
            {
                "dagster/asset_partition_range_start": "2026-01-01",
                "dagster/asset_partition_range_end": "2026-01-31",
            },
            None,
            True,
        ),
        # A run not started (or queued) holds no slot: it could be waiting behind this one.
        ("NOT_STARTED", {"dagster/partition": "2026-01-01"}, None, False),
        ("SUCCESS", {"dagster/partition": "2026-01-01"}, None, False),
        # It writes no revenue.
        ("STARTED", {"dagster/partition": "2026-01-01"}, ["raw_trips", "trips"], False),
        # The same first day or later: it writes no day this one reads.
        ("STARTED", {"dagster/partition": "2026-01-02"}, None, False),
        ("STARTED", {"dagster/partition": "2026-01-03"}, None, False),
    ],
)
def test_a_total_waits_only_for_runs_in_progress_that_write_an_earlier_day(
    status: str, tags: dict[str, str], assets: list[str] | None, waits: bool
) -> None:
    with dg.instance_for_test() as instance:
        me = add_run(instance, dg.DagsterRunStatus.STARTED, {"dagster/partition": "2026-01-02"})
        other = add_run(instance, dg.DagsterRunStatus(status), tags, assets)

        assert earlier_writers(instance, me, "2026-01-02") == ([other] if waits else [])
