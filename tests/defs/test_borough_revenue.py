"""daily_borough_revenue: one (day, borough) partition, reruns, ranges of either dimension."""

from collections import defaultdict
from datetime import date, datetime
from decimal import Decimal

import dagster as dg
import pyarrow as pa
import pytest

from idem_assets.defs.daily_borough_revenue import UnknownZoneError, borough_revenue, window_cells
from idem_assets.defs.partitions import DAILY, DAILY_BY_BOROUGH
from idem_assets.defs.zones import BOROUGH_OF_ZONE, BOROUGHS

from .support import (
    ROWS,
    MakePipeline,
    Pipeline,
    d,
    days,
    delivered_trips,
    failure_text,
    materialized,
)

ASSET = "daily_borough_revenue"
Row = tuple[date, str, int, int, Decimal, Decimal, Decimal]


def key(day: str, borough: str) -> str:
    """The multi-partition key of a (day, borough), as Dagster spells it."""
    return dg.MultiPartitionKey({"date": day, "borough": borough})


def expected_rows(pipeline: Pipeline, day: str, boroughs: tuple[str, ...] = BOROUGHS) -> list[Row]:
    """The day's trips, passengers, fares, tips and revenue per borough, from the landing CSV."""
    sums: dict[str, list] = defaultdict(lambda: [0, 0, Decimal(0), Decimal(0)])
    for trip in delivered_trips(pipeline, day):
        row = sums[BOROUGH_OF_ZONE[trip["pickup_zone"]]]
        row[0] += 1
        row[1] += int(trip["passenger_count"])
        row[2] += Decimal(trip["fare"])
        row[3] += Decimal(trip["tip"])
    return [(d(day), b, *sums[b], sums[b][2] + sums[b][3]) for b in sorted(boroughs)]


def stored(pipeline: Pipeline) -> list[Row]:
    """Every row of daily_borough_revenue, by day and borough."""
    return pipeline.query(f"SELECT * FROM {ASSET} ORDER BY day, borough")


def read_log(pipeline: Pipeline, result: dg.ExecuteInProcessResult) -> list[str]:
    """The asset's line saying how many trips of how many days it read."""
    return [m for m in pipeline.logs(result) if "trip(s) read" in m]


@pytest.fixture
def loaded(pipeline: Pipeline) -> Pipeline:
    """Three days of trips through taxi_daily; daily_borough_revenue not materialised yet."""
    pipeline.generate("2026-01-01", "2026-01-03")
    pipeline.run_ok("2026-01-01", "2026-01-03")
    return pipeline


def test_one_borough_of_one_day_reads_that_day_only(loaded: Pipeline) -> None:
    result = loaded.materialize(ASSET, key("2026-01-02", "Queens"))

    assert result.success, failure_text(result)
    assert materialized(result) == {ASSET: [key("2026-01-02", "Queens")]}
    assert stored(loaded) == expected_rows(loaded, "2026-01-02", ("Queens",))
    # The input is the day's trips of the three loaded, not the table.
    assert read_log(loaded, result) == [
        f"{key('2026-01-02', 'Queens')}: {ROWS} trip(s) read, of 1 day(s)"
    ]


def test_a_rerun_leaves_identical_rows(loaded: Pipeline) -> None:
    assert loaded.materialize(ASSET, key("2026-01-01", "Manhattan")).success
    first = stored(loaded)

    result = loaded.materialize(ASSET, key("2026-01-01", "Manhattan"))

    assert result.success, failure_text(result)
    assert first == stored(loaded) == expected_rows(loaded, "2026-01-01", ("Manhattan",))
    md = {
        k: v.value
        for k, v in result.get_asset_materialization_events()[0].materialization.metadata.items()
    }
    assert (md["rows_inserted"], md["rows_deleted"], md["dagster/row_count"]) == (1, 1, 1)


def test_a_range_of_days_for_one_borough_in_one_run(loaded: Pipeline) -> None:
    assert loaded.materialize(ASSET, key("2026-01-02", "Manhattan")).success
    manhattan = stored(loaded)

    result = loaded.materialize(ASSET, key("2026-01-01", "Brooklyn"), key("2026-01-03", "Brooklyn"))

    assert result.success, failure_text(result)
    assert sorted(materialized(result)[ASSET], key=str) == [
        key(day, "Brooklyn") for day in days("2026-01-01", "2026-01-03")
    ]
    brooklyn = [
        r
        for day in days("2026-01-01", "2026-01-03")
        for r in expected_rows(loaded, day, ("Brooklyn",))
    ]
    assert stored(loaded) == sorted(brooklyn + manhattan, key=lambda r: (r[0], r[1]))
    assert read_log(loaded, result) == [
        f"{key('2026-01-01', 'Brooklyn')}...{key('2026-01-03', 'Brooklyn')} (3):"
        f" {3 * ROWS} trip(s) read, of 3 day(s)"
    ]


def test_every_borough_of_a_day_sums_to_the_days_revenue(loaded: Pipeline) -> None:
    result = loaded.materialize(
        ASSET, key("2026-01-03", BOROUGHS[0]), key("2026-01-03", BOROUGHS[-1])
    )

    assert result.success, failure_text(result)
    assert sorted(materialized(result)[ASSET], key=str) == [key("2026-01-03", b) for b in BOROUGHS]
    assert stored(loaded) == expected_rows(loaded, "2026-01-03")
    assert loaded.query(
        f"SELECT sum(trips), sum(passengers), sum(fares), sum(tips), sum(revenue) FROM {ASSET}"
    ) == loaded.query(
        "SELECT sum(trips), sum(passengers), sum(fares), sum(tips), sum(revenue)"
        " FROM daily_zone_revenue WHERE day = DATE '2026-01-03'"
    )


def test_a_backfill_of_every_borough_over_days_runs_as_dagster_chunks_it(
    make_pipeline: MakePipeline,
) -> None:
    one_by_one = make_pipeline("one_by_one")
    one_by_one.generate("2026-01-01", "2026-01-04")
    one_by_one.run_ok("2026-01-01", "2026-01-04")
    backfilled = make_pipeline("backfilled", root=one_by_one.root)
    backfilled.run_ok("2026-01-01", "2026-01-04")
    every = [key(day, b) for day in days("2026-01-01", "2026-01-04") for b in BOROUGHS]

    # The ranges an asset backfill of these keys runs: one borough's four days per run.
    subset = DAILY_BY_BOROUGH.subset_with_partition_keys(every)
    ranges = sorted(subset.get_partition_key_ranges(DAILY_BY_BOROUGH), key=lambda r: r.start)
    assert [(r.start, r.end) for r in ranges] == [
        (key("2026-01-01", b), key("2026-01-04", b)) for b in BOROUGHS
    ]
    for r in ranges:
        result = backfilled.materialize(ASSET, r.start, r.end)
        assert result.success, failure_text(result)
    for k in every:
        assert one_by_one.materialize(ASSET, k).success

    rows = stored(backfilled)
    assert rows == stored(one_by_one)
    assert rows == [
        r for day in days("2026-01-01", "2026-01-04") for r in expected_rows(backfilled, day)
    ]
    assert backfilled.query(
        f"SELECT day, sum(revenue) FROM {ASSET} GROUP BY day ORDER BY day"
    ) == backfilled.query(
        "SELECT day, sum(revenue) FROM daily_zone_revenue GROUP BY day ORDER BY day"
    )
    # A backfill again over what it wrote changes nothing.
    for r in ranges:
        assert backfilled.materialize(ASSET, r.start, r.end).success
    assert stored(backfilled) == rows


def test_trips_of_a_zone_without_a_borough_are_refused() -> None:
    trips = pa.table(
        {
            "pickup_at": pa.array([datetime(2026, 1, 1, 9)] * 3, pa.timestamp("us")),
            "passenger_count": [1, 2, 3],
            "fare": [10.0, 20.0, 30.0],
            "tip": [1.0, 2.0, 3.0],
            "pickup_zone": ["JFK Airport", "Astoria", "Astoria"],
        }
    )

    with pytest.raises(UnknownZoneError) as refused:
        borough_revenue(trips, window_cells([key("2026-01-01", "Queens")]), "Queens|2026-01-01")

    assert str(refused.value) == (
        "Refused to write asset 'daily_borough_revenue', partition(s) Queens|2026-01-01: 2"
        " trip(s) were picked up in 1 zone(s) the zone-to-borough lookup does not know, so their"
        " revenue would belong to no borough. Nothing was changed. Fix: add each zone with its"
        " borough (TLC's taxi_zone_lookup.csv) to BOROUGH_OF_ZONE in idem_assets/defs/zones.py,"
        " then rerun. Sample:\n    pickup_zone='Astoria', trips=2"
    )


def test_a_borough_without_trips_that_day_holds_zeros() -> None:
    trips = pa.table(
        {
            "pickup_at": pa.array([datetime(2026, 1, 1, 9)], pa.timestamp("us")),
            "passenger_count": [2],
            "fare": [10.5],
            "tip": [1.25],
            "pickup_zone": ["JFK Airport"],
        }
    )
    cells = window_cells([key("2026-01-01", b) for b in BOROUGHS])

    rows = borough_revenue(trips, cells, "2026-01-01").to_pylist()

    zero = {"trips": 0, "passengers": 0, "fares": Decimal("0.00"), "tips": Decimal("0.00")}
    assert rows == [
        {"day": d("2026-01-01"), "borough": "Brooklyn", **zero, "revenue": Decimal("0.00")},
        {"day": d("2026-01-01"), "borough": "Manhattan", **zero, "revenue": Decimal("0.00")},
        {
            "day": d("2026-01-01"),
            "borough": "Queens",
            "trips": 1,
            "passengers": 2,
            "fares": Decimal("10.50"),
            "tips": Decimal("1.25"),
            "revenue": Decimal("11.75"),
        },
    ]


def test_a_day_whose_trips_were_never_loaded_is_refused(loaded: Pipeline) -> None:
    loaded.generate("2026-01-04")
    assert loaded.materialize(ASSET, key("2026-01-01", "Queens")).success
    before = stored(loaded)

    result = loaded.materialize(ASSET, key("2026-01-04", "Queens"))

    assert not result.success
    assert (
        "MissingUpstreamError: Refused to load asset 'trips' for 'daily_borough_revenue':"
        " partition(s) ['2026-01-04'] of 'trips' were never materialised"
    ) in failure_text(result)
    assert stored(loaded) == before == expected_rows(loaded, "2026-01-01", ("Queens",))


def test_a_partition_maps_to_its_day_of_trips_and_a_day_to_every_borough(
    pipeline: Pipeline,
) -> None:
    graph = pipeline.defs.resolve_asset_graph()
    mapping = graph.get_partition_mapping(dg.AssetKey(ASSET), dg.AssetKey("trips"))
    brooklyn = [key(day, "Brooklyn") for day in days("2026-01-01", "2026-01-03")]

    upstream = mapping.get_upstream_mapped_partitions_result_for_partitions(
        DAILY_BY_BOROUGH.subset_with_partition_keys(brooklyn), DAILY_BY_BOROUGH, DAILY
    )
    downstream = mapping.get_downstream_partitions_for_partitions(
        DAILY.subset_with_partition_keys(["2026-01-02"]), DAILY, DAILY_BY_BOROUGH
    )

    assert sorted(upstream.partitions_subset.get_partition_keys()) == days(
        "2026-01-01", "2026-01-03"
    )
    assert upstream.required_but_nonexistent_subset.is_empty
    assert sorted(downstream.get_partition_keys()) == [key("2026-01-02", b) for b in BOROUGHS]
