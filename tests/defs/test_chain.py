"""One day through the whole chain, reruns, range runs, and the running total's seed."""

from collections import defaultdict
from decimal import Decimal

import pytest

from idem_assets import landing
from idem_assets.defs.partitions import DAILY

from .support import (
    PARTITION_COLUMN,
    ROWS,
    TABLES,
    MakePipeline,
    Pipeline,
    check_evaluations,
    d,
    days,
    delivered_trips,
    failure_text,
    materialized,
    metadata,
)

#: The write-audit-publish checks declared on the four assets (each asset also gets in_window).
AUDIT_CHECKS = {
    ("raw_trips", "row_count"),
    ("raw_trips", "trip_id_pickup_at_not_null"),
    ("raw_trips", "trip_id_unique"),
    ("raw_trips", "passenger_count_between_1_and_6"),
    ("raw_trips", "pickup_at_freshness"),
    ("raw_trips", "in_window"),
    ("trips", "trip_id_unique"),
    ("trips", "fare_between_0_and_1000"),
    ("trips", "tip_between_0_and_1000"),
    ("trips", "in_window"),
    ("daily_zone_revenue", "day_pickup_zone_unique"),
    ("daily_zone_revenue", "revenue_between_0_and_10000000"),
    ("daily_zone_revenue", "in_window"),
    ("revenue_running_total", "one_row_per_day"),
    ("revenue_running_total", "day_unique"),
    ("revenue_running_total", "in_window"),
}


def expected_zone_revenue(trips: list[dict[str, str]]) -> dict[str, tuple[int, int, Decimal]]:
    """Trips, passengers and revenue per pickup zone, in exact decimals."""
    out: dict[str, list] = defaultdict(lambda: [0, 0, Decimal(0)])
    for t in trips:
        zone = out[t["pickup_zone"]]
        zone[0] += 1
        zone[1] += int(t["passenger_count"])
        zone[2] += Decimal(t["fare"]) + Decimal(t["tip"])
    return {z: (n, p, r) for z, (n, p, r) in out.items()}


def test_one_day_through_the_whole_chain(pipeline: Pipeline) -> None:
    pipeline.generate("2026-01-01")
    manifest_rows = landing.read_day(pipeline.root, d("2026-01-01")).expected_rows

    result = pipeline.run_ok("2026-01-01")

    assert materialized(result) == {t: ["2026-01-01"] for t in TABLES}
    assert manifest_rows == ROWS
    assert pipeline.rows_per_day("raw_trips") == {"2026-01-01": manifest_rows}
    assert pipeline.rows_per_day("trips") == {"2026-01-01": manifest_rows}

    expected = expected_zone_revenue(delivered_trips(pipeline, "2026-01-01"))
    zones = pipeline.query(
        "SELECT pickup_zone, trips, passengers, revenue FROM daily_zone_revenue"
        " WHERE day = DATE '2026-01-01' ORDER BY pickup_zone"
    )
    assert {z: (n, p, r) for z, n, p, r in zones} == expected
    assert len(zones) == len(expected) == len({z for z, *_ in zones})

    total_revenue = sum(r for _, _, r in expected.values())
    assert pipeline.query(
        "SELECT day::VARCHAR, revenue, running_total FROM revenue_running_total"
    ) == [("2026-01-01", total_revenue, total_revenue)]

    evaluations = check_evaluations(result)
    # Every check of the code location ran in this run (new checks are covered automatically).
    declared = {
        (key.asset_key.to_user_string(), key.name)
        for key in pipeline.defs.resolve_asset_graph().asset_check_keys
    }
    assert set(evaluations) == declared
    assert AUDIT_CHECKS <= declared
    assert [k for k, ev in evaluations.items() if not ev.passed] == []

    inserted = {
        "raw_trips": ROWS,
        "trips": ROWS,
        "daily_zone_revenue": len(expected),
        "revenue_running_total": 1,
    }
    for table in TABLES:
        md = metadata(result, table)
        assert md["dagster/row_count"] == inserted[table], table
        assert (md["rows_inserted"], md["rows_updated"], md["rows_deleted"]) == (
            inserted[table],
            0,
            0,
        ), table


def test_rerun_of_a_day_leaves_every_table_identical(pipeline: Pipeline) -> None:
    pipeline.generate("2026-01-01", "2026-01-02")
    pipeline.run_ok("2026-01-01")
    pipeline.run_ok("2026-01-02")
    before = pipeline.fingerprints()

    result = pipeline.run_ok("2026-01-02")

    assert pipeline.fingerprints() == before
    assert all(before.values())
    # An overwrite replaces the day; a merge matches every key and deletes nothing.
    raw, trips = metadata(result, "raw_trips"), metadata(result, "trips")
    assert (raw["rows_inserted"], raw["rows_updated"], raw["rows_deleted"]) == (ROWS, 0, ROWS)
    assert (trips["rows_inserted"], trips["rows_updated"], trips["rows_deleted"]) == (0, ROWS, 0)


def test_a_range_in_one_run_equals_the_same_days_one_by_one(make_pipeline: MakePipeline) -> None:
    one_by_one = make_pipeline("one_by_one")
    one_by_one.generate("2026-01-01", "2026-01-04")
    ranged = make_pipeline("ranged", root=one_by_one.root)

    for day in days("2026-01-01", "2026-01-04"):
        one_by_one.run_ok(day)
    ranged.run_ok("2026-01-01")
    result = ranged.run_ok("2026-01-02", "2026-01-04")

    expected = one_by_one.fingerprints()
    assert all(expected.values())
    assert ranged.fingerprints() == expected
    assert materialized(result) == {t: days("2026-01-02", "2026-01-04") for t in TABLES}
    assert all(metadata(result, t)["range_partitions_written"] == 3 for t in TABLES)
    seeded = [m for m in ranged.logs(result) if m.startswith("Revenue of the")]
    assert seeded == [
        f"Revenue of the 1 day(s) before 2026-01-02: {day_revenue(ranged, '2026-01-01')}"
    ]


def test_a_first_backfill_from_the_first_partition_in_one_run(make_pipeline: MakePipeline) -> None:
    one_by_one = make_pipeline("one_by_one")
    one_by_one.generate("2026-01-01", "2026-01-03")
    from_start = make_pipeline("from_start", root=one_by_one.root)
    for day in days("2026-01-01", "2026-01-03"):
        one_by_one.run_ok(day)

    from_start.run_ok("2026-01-01", "2026-01-03")

    assert from_start.fingerprints() == one_by_one.fingerprints()


@pytest.mark.parametrize(
    ("history", "missing"),
    [("no table yet", ["2026-01-01", "2026-01-02"]), ("first day only", ["2026-01-02"])],
)
def test_running_total_refuses_a_day_whose_earlier_revenue_was_never_materialized(
    pipeline: Pipeline, history: str, missing: list[str]
) -> None:
    pipeline.generate("2026-01-01", "2026-01-03")
    if history == "first day only":
        pipeline.run_ok("2026-01-01")
    before = pipeline.fingerprints()["revenue_running_total"]

    result = pipeline.run("2026-01-03")

    assert not result.success
    message = failure_text(result)
    assert (
        "MissingUpstreamError: Refused to write asset 'revenue_running_total', partition(s) from"
        f" 2026-01-03: daily_zone_revenue was never materialized for {len(missing)} earlier"
        f" day(s) {missing}, so their revenue would count as 0 in every total from 2026-01-03"
        " on. Nothing was changed. Fix: materialize the taxi group for"
        f" {missing[0]}...{missing[-1]} first (a backfill of that range), then rerun 2026-01-03."
    ) in message
    # The other assets do not depend on the past, so they were published.
    assert materialized(result) == {
        "raw_trips": ["2026-01-03"],
        "trips": ["2026-01-03"],
        "daily_zone_revenue": ["2026-01-03"],
    }
    assert pipeline.fingerprints()["revenue_running_total"] == before


def day_revenue(pipeline: Pipeline, day: str) -> Decimal:
    """The day's revenue summed over its zones in daily_zone_revenue."""
    return pipeline.query(
        "SELECT sum(revenue) FROM daily_zone_revenue WHERE day = CAST(? AS DATE)", [day]
    )[0][0]


def test_first_partition_is_seeded_with_zero(pipeline: Pipeline) -> None:
    pipeline.generate("2026-01-01", "2026-01-02")
    pipeline.run_ok("2026-01-01")
    pipeline.run_ok("2026-01-02")

    totals = pipeline.query(
        "SELECT day::VARCHAR, revenue, running_total FROM revenue_running_total ORDER BY day"
    )
    revenue = dict(
        pipeline.query(
            "SELECT day::VARCHAR, sum(revenue) FROM daily_zone_revenue GROUP BY 1 ORDER BY 1"
        )
    )
    day1, day2 = revenue["2026-01-01"], revenue["2026-01-02"]
    assert totals == [("2026-01-01", day1, day1), ("2026-01-02", day2, day1 + day2)]
    assert all(isinstance(v, Decimal) for row in totals for v in row[1:])


def test_the_demo_reads_each_table_by_its_partition_column(pipeline: Pipeline) -> None:
    # The demo and these tests count rows per day with PARTITION_COLUMN; it must follow the
    # daily assets' own partition_expr metadata (daily_borough_revenue's names two dimensions).
    graph = pipeline.defs.resolve_asset_graph()
    declared = {
        key.to_user_string(): graph.get(key).metadata["partition_expr"]
        for key in graph.get_all_asset_keys()
        if "partition_expr" in graph.get(key).metadata and graph.get(key).partitions_def == DAILY
    }
    assert declared == PARTITION_COLUMN
