"""Shared helpers for the reliability suite: run sizes, deterministic batches, fingerprints."""

import os
from collections.abc import Sequence
from datetime import date, timedelta
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

import idem_assets as ia
from tests.helpers import DAILY, NOW, settings, window

__all__ = ["DAILY", "NOW", "settings", "window"]

#: ``IDEM_FULL=1`` runs every reliability test at its full count (``make test-full``).
FULL = os.environ.get("IDEM_FULL", "") not in ("", "0")

#: Base seed of every randomised test; ``IDEM_SEED=<n>`` replays another run.
SEED = int(os.environ.get("IDEM_SEED", "20260101"))

TABLE = "trips"
PARTITION = "pickup_at"
METADATA: dict[str, Any] = {"partition_expr": PARTITION, "primary_key": ["trip_id"]}
ZONES = ("JFK Airport", "Midtown Center", "Park Slope, Brooklyn", "Times Sq/Theatre District")

#: Lines that the suite prints after the test summary (crash counts, soak numbers).
REPORT: list[str] = []


def count(default: int, full: int) -> int:
    """``default`` in the everyday run, ``full`` under ``IDEM_FULL=1``."""
    return full if FULL else default


def days(first: str, n: int) -> list[str]:
    """``n`` consecutive daily partition keys starting at ``first``."""
    start = date.fromisoformat(first)
    return [(start + timedelta(days=i)).isoformat() for i in range(n)]


def day_batch(day: str, rows: int, version: int = 0, *, duplicates: int = 0) -> pa.Table:
    """A deterministic batch for ``day``; a later ``version`` is a correction of version 0.

    A correction changes every fare, drops about a tenth of the trips and adds new ones, so every
    partition's fingerprint differs between versions. Trip ids are unique across days.
    ``duplicates`` appends older copies of that many trips (for ``dedupe_order_by``).
    """
    day_ordinal = date.fromisoformat(day).toordinal()
    rng = np.random.default_rng([day_ordinal, version])
    base = int(day.replace("-", "")) * 1_000_000
    ids = base + np.arange(rows, dtype=np.int64)
    if version:
        kept = ids[rng.random(rows) > 0.1]
        added = base + 500_000 + version * 10_000 + np.arange(max(1, rows // 10), dtype=np.int64)
        ids = np.concatenate([kept, added])
    n = len(ids)
    start = np.datetime64(day, "us")
    pickup = start + rng.integers(0, 86_400_000_000, n).astype("timedelta64[us]")
    updated = pickup + np.timedelta64(2, "h")
    table = pa.table(
        {
            "trip_id": pa.array(ids, pa.int64()),
            PARTITION: pa.array(pickup, pa.timestamp("us")),
            "updated_at": pa.array(updated, pa.timestamp("us")),
            "passenger_count": pa.array(1 + (ids + version) % 6, pa.int64()),
            "fare": pa.array(np.round(5 + rng.random(n) * 50, 2) + version, pa.float64()),
            "zone": pa.array([ZONES[i % len(ZONES)] for i in range(n)], pa.string()),
        }
    )
    if duplicates:
        older = table.slice(0, duplicates)
        older = older.set_column(
            2, "updated_at", pa.array(updated[:duplicates] - np.timedelta64(1, "h"))
        )
        older = older.set_column(4, "fare", pa.array(np.full(duplicates, -1.0)))
        table = pa.concat_tables([table, older])
    return table


def range_batch(keys: Sequence[str], rows: int, version: int = 0, duplicates: int = 0) -> pa.Table:
    """One batch covering every day of ``keys`` (a backfill chunk)."""
    return pa.concat_tables([day_batch(k, rows, version, duplicates=duplicates) for k in keys])


def partition_fingerprints(
    conn: duckdb.DuckDBPyConnection, keys: Sequence[str], table: str = TABLE
) -> dict[str, str | None]:
    """The fingerprint of each daily partition of ``table`` (``None`` when there is no table)."""
    return {k: ia.table_fingerprint(conn, "main", table, PARTITION, window(k)) for k in keys}


def database_fingerprint(conn: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """Every schema, view and table of the database: columns, types and a fingerprint of rows."""
    result: dict[str, Any] = {
        "schemas": conn.execute(
            "SELECT schema_name FROM duckdb_schemas() WHERE NOT internal ORDER BY ALL"
        ).fetchall(),
        "views": conn.execute(
            "SELECT schema_name, view_name, sql FROM duckdb_views() WHERE NOT internal ORDER BY ALL"
        ).fetchall(),
    }
    tables = conn.execute(
        "SELECT schema_name, table_name, temporary FROM duckdb_tables() ORDER BY ALL"
    ).fetchall()
    for schema, table, temporary in tables:
        columns = conn.execute(
            "SELECT column_name, data_type FROM duckdb_columns()"
            " WHERE schema_name = ? AND table_name = ? ORDER BY column_index",
            [schema, table],
        ).fetchall()
        result[f"{schema}.{table}"] = (
            temporary,
            columns,
            ia.table_fingerprint(conn, schema, table),
        )
    return result


def rows(conn: duckdb.DuckDBPyConnection, table: str = TABLE) -> list[tuple]:
    """Every row of ``table``, sorted, so equal tables compare equal whatever the storage order."""
    return sorted(conn.execute(f'SELECT * FROM main."{table}"').fetchall())
