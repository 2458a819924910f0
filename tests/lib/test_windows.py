"""Partition keys and windows at the edges: daylight saving time, and columns coarser than a key."""

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import dagster as dg
import pandas as pd
import pytest

import idem_assets as ia

from .support import read, run

NEW_YORK = ZoneInfo("America/New_York")
HOURLY_NY = dg.HourlyPartitionsDefinition(
    start_date="2026-10-31-00:00", timezone="America/New_York"
)
#: The fall-back day: 01:00 happens twice, and Dagster keys the second one with its offset.
FALL_BACK = ["2026-11-01-00:00", "2026-11-01-01:00", "2026-11-01-01:00-0500", "2026-11-01-02:00"]


def readings_asset(column: Callable[[list[datetime]], pd.Series]) -> dg.AssetsDefinition:
    """An audited hourly asset: four readings per hour, ``read_at`` built by ``column``."""

    @ia.audited_asset(
        partitions_def=HOURLY_NY,
        io_manager_key="io_manager",
        metadata={"partition_expr": "read_at"},
        checks=[ia.row_count(4)],
    )
    def readings(context: dg.AssetExecutionContext) -> pd.DataFrame:
        """Meter readings, four per hour."""
        # In UTC: adding minutes to the second 01:00 in New York would land in the first.
        start = context.partition_time_window.start.astimezone(UTC)
        times = [start + timedelta(minutes=15 * i) for i in range(4)]
        return pd.DataFrame(
            {
                "reading_id": [f"{context.partition_key}/{i}" for i in range(4)],
                "read_at": column(times),
                "value": [1.0, 2.0, 3.0, 4.0],
            }
        )

    return readings


def aware(times: list[datetime]) -> pd.Series:
    return pd.Series(pd.DatetimeIndex(times).tz_convert("UTC"))


def naive(times: list[datetime]) -> pd.Series:
    return pd.Series([t.astimezone(NEW_YORK).replace(tzinfo=None) for t in times])


def dates(times: list[datetime]) -> pd.Series:
    return pd.Series([t.astimezone(NEW_YORK).date() for t in times])


def test_dagster_lists_both_fall_back_hours() -> None:
    keys = HOURLY_NY.get_partition_keys_in_range(dg.PartitionKeyRange(FALL_BACK[0], FALL_BACK[-1]))
    assert keys == FALL_BACK


def test_every_fall_back_hour_is_written_to_a_timestamptz_column_and_reruns_the_same(
    tmp_path: Path,
) -> None:
    db = tmp_path / "w.duckdb"
    asset = readings_asset(aware)
    for key in FALL_BACK:
        run([asset], db, key)
    with read(db) as conn:
        once = conn.execute("SELECT * FROM readings ORDER BY read_at").fetchall()
    for key in FALL_BACK:
        run([asset], db, key)

    with read(db) as conn:
        again = conn.execute("SELECT * FROM readings ORDER BY read_at").fetchall()
        hours = conn.execute(
            "SELECT split_part(reading_id, '/', 1), min(read_at), count(*) FROM readings"
            " GROUP BY 1 ORDER BY 2"
        ).fetchall()
    assert again == once
    assert [(k, t.astimezone(UTC), n) for k, t, n in hours] == [
        ("2026-11-01-00:00", datetime(2026, 11, 1, 4, tzinfo=UTC), 4),
        ("2026-11-01-01:00", datetime(2026, 11, 1, 5, tzinfo=UTC), 4),
        ("2026-11-01-01:00-0500", datetime(2026, 11, 1, 6, tzinfo=UTC), 4),
        ("2026-11-01-02:00", datetime(2026, 11, 1, 7, tzinfo=UTC), 4),
    ]


@pytest.mark.parametrize("key", ["2026-11-01-01:00", "2026-11-01-01:00-0500"])
def test_a_repeated_hour_on_a_naive_column_is_refused_and_says_why(
    tmp_path: Path, key: str
) -> None:
    db = tmp_path / "w.duckdb"
    asset = readings_asset(naive)
    run([asset], db, "2026-11-01-00:00")
    with read(db) as conn:
        before = conn.execute("SELECT * FROM readings ORDER BY ALL").fetchall()

    with pytest.raises(ia.ConfigurationError) as refused:
        run([asset], db, key)

    assert "cannot tell the two 01:00 hours apart" in str(refused.value)
    assert "Fix: store the column as TIMESTAMPTZ" in str(refused.value)
    assert "or use UTC partitions" in str(refused.value)
    with read(db) as conn:
        assert conn.execute("SELECT * FROM readings ORDER BY ALL").fetchall() == before


def test_hours_that_happen_once_are_written_to_a_naive_column(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    for key in ("2026-11-01-00:00", "2026-11-01-02:00"):
        run([readings_asset(naive)], db, key)
    with read(db) as conn:
        assert conn.execute("SELECT min(read_at), count(*) FROM readings").fetchall() == [
            (datetime(2026, 11, 1, 0), 8)
        ]


def test_hourly_partitions_on_a_date_column_are_refused_as_finer_than_the_column(
    tmp_path: Path,
) -> None:
    db = tmp_path / "w.duckdb"
    with pytest.raises(ia.ConfigurationError) as refused:
        run([readings_asset(dates)], db, "2026-10-31-05:00")
    assert "The partitions are finer than the column's resolution" in str(refused.value)
    assert "Fix: make the partition column a TIMESTAMP" in str(refused.value)
    assert not db.exists() or read(db).execute("SHOW TABLES").fetchall() == []


@pytest.mark.parametrize(
    "key",
    ["2026-11-1-01:00", "2026-11-01-01:00-0400", "2026-10-30-23:00", "2026-11-01-25:00"],
)
def test_keys_the_definition_does_not_give_are_refused(key: str) -> None:
    with pytest.raises(ia.ConfigurationError, match="Fix: pass a key of the definition"):
        ia.window_from_keys(HOURLY_NY, [key], "readings")


def test_the_fall_back_keys_get_one_hour_windows_each() -> None:
    window = ia.window_from_keys(HOURLY_NY, FALL_BACK, "readings")
    hours = [p.end.timestamp() - p.start.timestamp() for p in window.partitions]
    assert hours == [3600.0] * 4
    assert window.keys == FALL_BACK
    assert window.partitions[2].start.astimezone(UTC) == datetime(2026, 11, 1, 6, tzinfo=UTC)
    assert window.partitions[2].start.astimezone(NEW_YORK).utcoffset() == timedelta(hours=-5)
