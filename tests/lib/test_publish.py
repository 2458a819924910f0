"""publish() called directly: fingerprints, timestamps and time zones, multi-day windows."""

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import dagster as dg
import duckdb
import pandas as pd
import pytest

import idem_assets as ia
from idem_assets.lib.dagster_layer.frames import to_arrow

from .support import DAYS, NOW, count, fingerprint, publish, rows, settings, trips

NO_KEY = {"partition_expr": "pickup_at"}


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    with duckdb.connect(str(tmp_path / "w.duckdb")) as connection:
        yield connection


def test_fingerprint_ignores_row_order(conn: duckdb.DuckDBPyConnection) -> None:
    batch = trips("2026-01-02")
    first = publish(conn, batch, settings("overwrite", NO_KEY), ["2026-01-02"])
    shuffled = batch.sample(frac=1, random_state=7)
    second = publish(conn, shuffled, settings("overwrite", NO_KEY), ["2026-01-02"])

    assert first.fingerprint == second.fingerprint == fingerprint(conn, "trips", "2026-01-02")


def test_fingerprint_sees_a_doubled_row_and_a_changed_value(
    conn: duckdb.DuckDBPyConnection,
) -> None:
    batch = trips("2026-01-02")
    clean = publish(conn, batch, settings("overwrite", NO_KEY), ["2026-01-02"]).fingerprint
    doubled = pd.concat([batch, batch.iloc[[0]]])
    with_double = publish(conn, doubled, settings("overwrite", NO_KEY), ["2026-01-02"]).fingerprint
    changed = batch.assign(fare=batch["fare"].where(batch.index != 0, 0.0))
    with_change = publish(conn, changed, settings("overwrite", NO_KEY), ["2026-01-02"]).fingerprint

    assert len({clean, with_double, with_change}) == 3
    assert with_double.startswith("1001:")
    # Swapping two rows' fares keeps every column's multiset but changes the rows.
    swapped = batch.copy()
    swapped.loc[[0, 1], "fare"] = swapped.loc[[1, 0], "fare"].to_numpy()
    assert swapped["fare"].iloc[0] != batch["fare"].iloc[0]
    with_swap = publish(conn, swapped, settings("overwrite", NO_KEY), ["2026-01-02"])
    assert with_swap.fingerprint != clean


def test_unpartitioned_publish_reports_the_whole_table(conn: duckdb.DuckDBPyConnection) -> None:
    frame = pd.DataFrame({"id": [1, 2, 3], "name": ["a", "b", "c"]})
    first = publish(conn, frame, settings("overwrite", {}, table="t", partitioned=False), None)
    again = publish(conn, frame, settings("overwrite", {}, table="t", partitioned=False), None)

    assert (first.rows, first.inserted, first.deleted, first.partitions) == (3, 3, 0, [])
    assert (again.rows, again.inserted, again.deleted) == (3, 3, 3)
    assert again.fingerprint == first.fingerprint == fingerprint(conn, "t")


def test_a_range_window_only_touches_its_days(conn: duckdb.DuckDBPyConnection) -> None:
    for day in DAYS:
        publish(conn, trips(day), settings("overwrite"), [day])
    before = fingerprint(conn, "trips", "2026-01-01")

    two_days = pd.concat([trips("2026-01-02", 10), trips("2026-01-03", 20)])
    result = publish(conn, two_days, settings("overwrite"), ["2026-01-02", "2026-01-03"])

    assert (result.rows, result.inserted, result.deleted) == (30, 30, 2000)
    assert result.partitions == ["2026-01-02", "2026-01-03"]
    assert fingerprint(conn, "trips", "2026-01-01") == before
    assert [count(conn, day=d) for d in DAYS] == [1000, 10, 20]


def test_timestamps_are_stored_as_microseconds(conn: duckdb.DuckDBPyConnection) -> None:
    publish(conn, trips("2026-01-02"), settings("overwrite"), ["2026-01-02"])
    types = dict(conn.execute("SELECT column_name, data_type FROM duckdb_columns()").fetchall())
    assert types["pickup_at"] == "TIMESTAMP"


def test_tz_aware_batches_round_trip(conn: duckdb.DuckDBPyConnection) -> None:
    def aware(day: str) -> pd.DataFrame:
        return trips(day).assign(pickup_at=lambda df: df["pickup_at"].dt.tz_localize("UTC"))

    first = publish(conn, aware("2026-01-02"), settings("merge"), ["2026-01-02"])
    second = publish(conn, aware("2026-01-02"), settings("merge"), ["2026-01-02"])
    types = dict(conn.execute("SELECT column_name, data_type FROM duckdb_columns()").fetchall())

    assert types["pickup_at"] == "TIMESTAMP WITH TIME ZONE"
    assert first.fingerprint == second.fingerprint
    assert (second.updated, second.inserted) == (1000, 0)
    with pytest.raises(ia.StrayRowsError):
        publish(conn, aware("2026-01-02"), settings("merge"), ["2026-01-03"])
    naive = trips("2026-01-02")
    with pytest.raises(ia.SchemaMismatchError, match="tz_localize"):
        publish(conn, naive, settings("merge"), ["2026-01-02"])


def test_windows_follow_the_partitions_time_zone(conn: duckdb.DuckDBPyConnection) -> None:
    new_york = dg.DailyPartitionsDefinition(start_date="2026-01-01", timezone="America/New_York")
    window = ia.window_from_keys(new_york, ["2026-01-02"], "trips")
    # 04:00 UTC on Jan 3 is 23:00 on Jan 2 in New York: inside the aware window.
    aware = pd.DataFrame(
        {"trip_id": [1, 2], "pickup_at": pd.to_datetime(["2026-01-02 05:00", "2026-01-03 04:00"])}
    ).assign(pickup_at=lambda df: df["pickup_at"].dt.tz_localize("UTC"))
    result = ia.publish(conn, to_arrow(aware, "t"), settings("overwrite"), window, now=NOW)
    assert result.rows == 2

    # Naive columns hold New York wall-clock time, so the same instant, written naive, is stray.
    naive = aware.assign(pickup_at=lambda df: df["pickup_at"].dt.tz_localize(None))
    with pytest.raises(ia.StrayRowsError):
        ia.publish(
            conn, to_arrow(naive, "t"), settings("overwrite", table="naive"), window, now=NOW
        )
    local = naive.assign(pickup_at=pd.to_datetime(["2026-01-02 00:00", "2026-01-02 23:59"]))
    assert (
        ia.publish(
            conn, to_arrow(local, "t"), settings("overwrite", table="naive"), window, now=NOW
        ).rows
        == 2
    )


def test_date_partition_column(conn: duckdb.DuckDBPyConnection) -> None:
    frame = pd.DataFrame({"id": [1, 2], "day": [datetime(2026, 1, 2).date()] * 2})
    md = {"partition_expr": "day", "primary_key": ["id"]}
    publish(conn, frame, settings("merge", md, table="daily"), ["2026-01-02"])
    with pytest.raises(ia.StrayRowsError):
        publish(conn, frame, settings("merge", md, table="daily"), ["2026-01-01"])
    assert rows(conn, "daily") == [
        (1, datetime(2026, 1, 2).date()),
        (2, datetime(2026, 1, 2).date()),
    ]


class OlderBackend:
    """A backend written before the protocol gained ``begin``: everything else is there."""

    engine = "Older"

    def __getattr__(self, name: str) -> object:
        if name == "begin":
            raise AttributeError(name)
        return lambda *args, **kwargs: None


def test_an_incomplete_backend_is_named_not_taken_for_a_duckdb_connection() -> None:
    with pytest.raises(TypeError) as refused:
        publish(OlderBackend(), trips("2026-01-01", 2), settings(), ["2026-01-01"])  # type: ignore[arg-type]

    assert str(refused.value) == (
        "OlderBackend is not a complete idem_assets Backend: it lacks ['begin']. Fix: implement"
        " them (idem_assets/lib/write/seam.py says what each does)."
    )
