"""The article's worked example and rerun idempotency, materialised for real with Dagster."""

from pathlib import Path

import pytest

import idem_assets as ia

from .support import (
    DAYS,
    ROWS_PER_DAY,
    count,
    fingerprint,
    output_metadata,
    partition_fingerprints,
    read,
    rows,
    run,
    trips,
    trips_asset,
    window,
)

IO_MANAGERS = ["overwrite_io_manager", "merge_io_manager"]


@pytest.mark.parametrize("io_manager", IO_MANAGERS)
def test_worked_example_three_days_written_twice_hold_3000_rows(
    tmp_path: Path, io_manager: str
) -> None:
    db = tmp_path / "warehouse.duckdb"
    asset = trips_asset(io_manager)

    for day in DAYS:
        run([asset], db, day)
    with read(db) as conn:
        after_run_1 = rows(conn)
    for day in DAYS:
        run([asset], db, day)

    with read(db) as conn:
        assert count(conn) == 3 * ROWS_PER_DAY == 3000
        assert [count(conn, day=day) for day in DAYS] == [1000, 1000, 1000]
        assert rows(conn) == after_run_1


def test_worked_example_plain_append_baseline_doubles_to_6000(tmp_path: Path) -> None:
    # The unsafe pattern the IO managers replace: INSERT the same three days again.
    with read(tmp_path / "append.duckdb") as conn:
        conn.register("empty_batch", trips(DAYS[0]).iloc[:0])
        conn.execute("CREATE TABLE main.trips AS SELECT * FROM empty_batch")
        for _run in range(2):
            for day in DAYS:
                conn.register("batch", trips(day))
                conn.execute("INSERT INTO main.trips SELECT * FROM batch")
        assert count(conn) == 6000
        assert conn.execute(
            "SELECT count(*) FROM (SELECT trip_id FROM main.trips GROUP BY 1 HAVING count(*) = 2)"
        ).fetchall() == [(3000,)]

        # The article's row-count check catches the doubled backfill, per day.
        report = ia.audit_table(
            conn.sql("SELECT * FROM main.trips").to_arrow_table(),
            [ia.row_count(1000)],
            "pickup_at",
            window(*DAYS),
        )
    (verdict,) = [v for v in report.verdicts if v.check.name == "row_count"]
    assert not verdict.passed
    assert verdict.per_partition == {
        day: {"rows": 2000, "expected": 1000, "delta": 1000} for day in DAYS
    }


def test_overwrite_rerun_of_a_partition_is_identical_and_reports_replace(tmp_path: Path) -> None:
    db = tmp_path / "warehouse.duckdb"
    asset = trips_asset("overwrite_io_manager")

    first = output_metadata(run([asset], db, "2026-01-02"))["2026-01-02"]
    with read(db) as conn:
        before = fingerprint(conn, "trips", "2026-01-02")
    second = output_metadata(run([asset], db, "2026-01-02"))["2026-01-02"]

    with read(db) as conn:
        assert fingerprint(conn, "trips", "2026-01-02") == before
        assert count(conn) == 1000
    assert (first["rows_inserted"], first["rows_updated"], first["rows_deleted"]) == (1000, 0, 0)
    assert (second["rows_inserted"], second["rows_updated"], second["rows_deleted"]) == (
        1000,
        0,
        1000,
    )
    assert first["fingerprint"] == second["fingerprint"] == before


def test_merge_rerun_of_a_partition_is_identical_and_reports_updates(tmp_path: Path) -> None:
    db = tmp_path / "warehouse.duckdb"
    asset = trips_asset("merge_io_manager")

    first = output_metadata(run([asset], db, "2026-01-02"))["2026-01-02"]
    second = output_metadata(run([asset], db, "2026-01-02"))["2026-01-02"]

    with read(db) as conn:
        assert fingerprint(conn, "trips", "2026-01-02") == first["fingerprint"]
        assert count(conn) == 1000
    assert (first["rows_inserted"], first["rows_updated"], first["rows_deleted"]) == (1000, 0, 0)
    assert (second["rows_inserted"], second["rows_updated"], second["rows_deleted"]) == (0, 1000, 0)
    assert second["fingerprint"] == first["fingerprint"]


@pytest.mark.parametrize("io_manager", IO_MANAGERS)
def test_a_range_written_in_one_run_equals_the_days_written_one_by_one(
    tmp_path: Path, io_manager: str
) -> None:
    asset = trips_asset(io_manager)
    ranged, daily = tmp_path / "ranged.duckdb", tmp_path / "daily.duckdb"

    result = run([asset], ranged, partition_range=(DAYS[0], DAYS[-1]))
    for day in DAYS:
        run([asset], daily, day)

    with read(ranged) as a, read(daily) as b:
        assert count(a) == 3000
        assert partition_fingerprints(a) == partition_fingerprints(b)
        assert rows(a) == rows(b)
        whole_range = fingerprint(a, "trips", *DAYS)
        per_day = {day: fingerprint(a, "trips", day) for day in DAYS}
    metadata = output_metadata(result)
    assert sorted(metadata) == list(DAYS)
    for day, md in metadata.items():
        # Each partition's materialization carries its own count and fingerprint ...
        assert md["dagster/row_count"] == 1000
        assert md["fingerprint"] == per_day[day]
        assert (md["rows_inserted"], md["rows_deleted"], md["partitions_written"]) == (1000, 0, 1)
        # ... and the range's totals are named as such.
        assert md["range_partitions_written"] == 3
        assert md["range_window"] == "[2026-01-01T00:00:00+00:00, 2026-01-04T00:00:00+00:00)"
        assert md["range_rows_inserted"] == 3000
        assert md["range_row_count"] == 3000
        assert md["range_fingerprint"] == whole_range

    # Rerunning the range is as harmless as rerunning one day.
    run([asset], ranged, partition_range=(DAYS[0], DAYS[-1]))
    with read(ranged) as a, read(daily) as b:
        assert partition_fingerprints(a) == partition_fingerprints(b)


def test_every_publish_reports_its_metadata(tmp_path: Path) -> None:
    db = tmp_path / "warehouse.duckdb"
    md = output_metadata(run([trips_asset("merge_io_manager")], db, "2026-01-01"))["2026-01-01"]

    with read(db) as conn:
        expected_fingerprint = fingerprint(conn, "trips", "2026-01-01")
    columns = md.pop("dagster/column_schema")
    assert [c.name for c in columns.columns][:2] == ["trip_id", "pickup_at"]
    assert md == {
        "dagster/row_count": 1000,
        "dagster/partition_row_count": 1000,
        "dagster/table_name": f"{db}.main.trips",
        "dagster/storage_kind": "duckdb",
        "write_mode": "merge",
        "rows_inserted": 1000,
        "rows_updated": 0,
        "rows_deleted": 0,
        "partitions_written": 1,
        "window": "[2026-01-01T00:00:00+00:00, 2026-01-02T00:00:00+00:00)",
        "fingerprint": expected_fingerprint,
    }
    assert md["fingerprint"].startswith("1000:")
