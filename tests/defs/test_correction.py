"""A corrected landing file: the rerun replaces exactly its day, and trips merges the changes."""

from decimal import Decimal

from idem_assets import landing

from .support import ROWS, Pipeline, d, day_fingerprints, materialized, metadata

DAYS = ("2026-01-01", "2026-01-02", "2026-01-03")
DAY = "2026-01-02"
CHANGED, REMOVED = 10, 5


def prices(pipeline: Pipeline, day: str) -> dict[str, tuple[float, float]]:
    """trip_id to (fare, tip) in the day's landing file."""
    table = landing.read_day(pipeline.root, d(day)).table
    return {t["trip_id"]: (t["fare"], t["tip"]) for t in table.to_pylist()}


def test_a_corrected_day_is_replaced_and_other_days_are_untouched(pipeline: Pipeline) -> None:
    pipeline.generate(DAYS[0], DAYS[-1])
    for day in DAYS:
        pipeline.run_ok(day)
    before = day_fingerprints(pipeline.database, DAYS)
    old = prices(pipeline, DAY)

    landing.correct(pipeline.root, d(DAY), changed=CHANGED, removed=REMOVED)
    new = prices(pipeline, DAY)
    removed = set(old) - set(new)
    changed = {i for i in new if new[i] != old[i]}
    assert (len(removed), len(changed)) == (REMOVED, CHANGED)

    result = pipeline.run_ok(DAY)

    assert materialized(result) == {
        t: [DAY] for t in ("raw_trips", "trips", "daily_zone_revenue", "revenue_running_total")
    }
    assert pipeline.rows_per_day("raw_trips") == {**dict.fromkeys(DAYS, ROWS), DAY: ROWS - REMOVED}
    assert pipeline.rows_per_day("trips") == {**dict.fromkeys(DAYS, ROWS), DAY: ROWS - REMOVED}
    stored = {
        trip_id: (fare, tip)
        for trip_id, fare, tip in pipeline.query(
            "SELECT trip_id, fare, tip FROM trips"
            " WHERE pickup_at >= DATE '2026-01-02' AND pickup_at < DATE '2026-01-03'"
        )
    }
    assert stored == new
    assert not removed & set(stored)

    # The merge matched every remaining key (rows_updated counts matched keys, changed or not)
    # and deleted the withdrawn trips of this day only.
    md = metadata(result, "trips")
    assert md["dagster/row_count"] == ROWS - REMOVED
    assert (md["rows_inserted"], md["rows_updated"], md["rows_deleted"]) == (
        0,
        ROWS - REMOVED,
        REMOVED,
    )
    raw = metadata(result, "raw_trips")
    assert (raw["rows_inserted"], raw["rows_deleted"]) == (ROWS - REMOVED, ROWS)

    after = day_fingerprints(pipeline.database, DAYS)
    assert {k: v for k, v in after.items() if k[1] != DAY} == {
        k: v for k, v in before.items() if k[1] != DAY
    }
    assert all(after[(t, DAY)] != before[(t, DAY)] for t in ("raw_trips", "trips"))

    # The corrected day's revenue and total follow the new fares.
    revenue = sum(Decimal(str(f)) + Decimal(str(t)) for f, t in new.values())
    day1_total = pipeline.query(
        "SELECT running_total FROM revenue_running_total WHERE day = DATE '2026-01-01'"
    )[0][0]
    assert pipeline.query(
        "SELECT revenue, running_total FROM revenue_running_total WHERE day = DATE '2026-01-02'"
    ) == [(revenue, day1_total + revenue)]
