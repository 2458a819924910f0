"""Deterministic taxi-trip batches, one daily partition at a time, built with numpy."""

from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta

import dagster as dg
import duckdb
import numpy as np
import pyarrow as pa

from idem_assets.lib.model.settings import WriteMode, WriteSettings
from idem_assets.lib.model.windows import WriteWindow
from tests import helpers

FIRST_DAY = date(2025, 1, 1)
DAILY = dg.DailyPartitionsDefinition(start_date=FIRST_DAY.isoformat())
TABLE = "trips"
PARTITION_COLUMN = "pickup_at"
KEY = "trip_id"
#: Far after every benchmark window, so the run-time value guard compares against a fixed clock.
NOW = datetime(2026, 6, 1, tzinfo=UTC)
#: Trip ids are ``day * ID_STRIDE + i``: unique across days, with room for new keys in a day.
ID_STRIDE = 10_000_000

_VENDORS = np.array(["CMT", "VTS", "DDS"])
_US_PER_DAY = 86_400_000_000


def partition_key(day: int) -> str:
    """Partition key of day number ``day`` (0 is the first day)."""
    return (FIRST_DAY + timedelta(days=day)).isoformat()


def day_bounds(day: int) -> tuple[datetime, datetime]:
    """Naive half-open bounds of day ``day``, as the TIMESTAMP column stores them."""
    start = datetime.combine(FIRST_DAY + timedelta(days=day), datetime.min.time())
    return start, start + timedelta(days=1)


def trips(day: int, rows: int, *, first_id: int = 0, seed: int = 0) -> pa.Table:
    """``rows`` trips picked up during day ``day``, in pickup order; ids from ``first_id``."""
    rng = np.random.default_rng([seed, day, first_id])
    start = np.datetime64(FIRST_DAY.isoformat(), "us") + np.timedelta64(day, "D")
    pickup = start + np.sort(rng.integers(0, _US_PER_DAY, rows)).astype("timedelta64[us]")
    ride = rng.integers(60_000_000, 3_600_000_000, rows).astype("timedelta64[us]")
    return pa.table(
        {
            KEY: pa.array(day * ID_STRIDE + first_id + np.arange(rows, dtype=np.int64)),
            PARTITION_COLUMN: pa.array(pickup),
            "dropoff_at": pa.array(pickup + ride),
            "updated_at": pa.array(pickup + ride + np.timedelta64(5, "m")),
            "vendor": pa.array(_VENDORS[rng.integers(0, len(_VENDORS), rows)]),
            "passenger_count": pa.array(rng.integers(1, 5, rows).astype(np.int32)),
            "distance_km": pa.array(np.round(rng.gamma(2.0, 2.0, rows), 3)),
            "fare": pa.array(np.round(rng.gamma(2.0, 8.0, rows), 2)),
        }
    )


def settings(mode: WriteMode = "overwrite", **metadata: object) -> WriteSettings:
    """Write settings of the ``trips`` asset, as the IO managers resolve them."""
    md = {"partition_expr": PARTITION_COLUMN, "primary_key": [KEY], **metadata}
    return helpers.settings(mode, md, table=TABLE)


def window(days: Sequence[int]) -> WriteWindow:
    """The write window of the given day numbers."""
    return helpers.window(*(partition_key(d) for d in days), partitions=DAILY, asset=TABLE)


def raw_overwrite(
    conn: duckdb.DuckDBPyConnection, batch: pa.Table, start: datetime, end: datetime
) -> None:
    """The baseline: ``BEGIN; DELETE window; INSERT INTO t SELECT * FROM arrow; COMMIT``."""
    conn.register("raw_batch", batch)
    try:
        conn.execute("BEGIN")
        conn.execute(
            f"DELETE FROM {TABLE} WHERE {PARTITION_COLUMN} >= ? AND {PARTITION_COLUMN} < ?",
            [start, end],
        )
        conn.execute(f"INSERT INTO {TABLE} SELECT * FROM raw_batch")
        conn.execute("COMMIT")
    finally:
        conn.unregister("raw_batch")


def load(conn: duckdb.DuckDBPyConnection, batches: Sequence[pa.Table]) -> None:
    """Create the table and append ``batches`` in order, in one statement (setup, untimed).

    DuckDB keeps insertion order by default, so the table holds the partitions in order.
    """
    conn.register("setup_batch", pa.concat_tables(batches))
    conn.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} AS SELECT * FROM setup_batch LIMIT 0")
    conn.execute(f"INSERT INTO {TABLE} SELECT * FROM setup_batch")
    conn.unregister("setup_batch")
    conn.execute("CHECKPOINT")
