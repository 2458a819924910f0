"""A Postgres publish's fingerprint is the fingerprint of the rows it stores, on any engine."""

from datetime import date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

import idem_assets as ia
from idem_assets.lib.backends.postgres.backend import PostgresBackend, PostgresLocation
from tests.helpers import NOW, TRIPS_METADATA, settings, window

DAY, NEXT = "2026-01-01", "2026-01-02"
ROWS = 6
START = datetime(2026, 1, 1)


def _values(kind: pa.DataType) -> list[object]:
    """Six values of ``kind`` (one NULL), chosen to catch a rounding or a lost sign."""
    if pa.types.is_integer(kind):
        return [0, -1, 7, None, 2**15 - 1 if kind.bit_width == 16 else 2**31 - 1, 42]
    if pa.types.is_floating(kind):
        return [0.0, -1.5, 3.25, None, 1e30, 0.1]
    if pa.types.is_decimal(kind):
        return [Decimal(v) if v else None for v in ["0.00", "-1.50", "12345.67", "", "0.01", "1"]]
    if pa.types.is_string(kind):
        return ["", "a", "Zürich ✓", None, "trailing space ", "x" * 300]
    if pa.types.is_binary(kind):
        return [b"", b"\x00\xff", b"abc", None, b"\x01" * 40, b"z"]
    if pa.types.is_boolean(kind):
        return [True, False, True, None, False, True]
    if pa.types.is_date(kind):
        return [date(1970, 1, 1), date(2026, 1, 1), date(1, 1, 1), None, date(9999, 12, 31), None]
    if pa.types.is_timestamp(kind):
        instants = [START + timedelta(microseconds=n * 1_234_567) for n in range(ROWS)]
        return [None if n == 3 else t for n, t in enumerate(instants)]
    if pa.types.is_time(kind):
        return [time(0), time(23, 59, 59, 999_999), time(12, 30, 0, 1), None, time(1), time(2)]
    raise AssertionError(kind)


#: One column type of each family the backend stores, as a batch sends it.
FAMILIES: dict[str, pa.DataType] = {
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "decimal": pa.decimal128(12, 2),
    "text": pa.string(),
    "bytea": pa.binary(),
    "boolean": pa.bool_(),
    "date": pa.date32(),
    "time": pa.time64("us"),
    "timestamp": pa.timestamp("us"),
    "timestamp_ns": pa.timestamp("ns"),
    "timestamptz": pa.timestamp("us", tz="America/New_York"),
}


def batch(kind: pa.DataType, day: str = DAY, first_id: int = 0) -> pa.Table:
    """``ROWS`` trips of ``day`` whose ``value`` column is of ``kind``."""
    start = datetime.fromisoformat(day)
    return pa.table(
        {
            "trip_id": pa.array(range(first_id, first_id + ROWS), pa.int64()),
            "pickup_at": pa.array(
                [start + timedelta(hours=n) for n in range(ROWS)], pa.timestamp("us")
            ),
            "value": pa.array(_values(kind), kind),
        }
    )


def upsert_settings() -> ia.WriteSettings:
    return settings("merge", {**TRIPS_METADATA, "delete_missing": False})


@pytest.mark.parametrize("family", FAMILIES)
def test_a_publish_reports_the_fingerprint_of_the_rows_it_stored(
    postgres_location: PostgresLocation, family: str
) -> None:
    kind = FAMILIES[family]
    with PostgresBackend.connect(postgres_location) as backend:

        def stored(*days: str) -> str | None:
            return ia.table_fingerprint(backend, "main", "trips", "pickup_at", window(*days))

        other = ia.publish(backend, batch(kind, NEXT, 100), settings(), window(NEXT), now=NOW)
        written = ia.publish(backend, batch(kind), settings(), window(DAY), now=NOW)
        assert (written.rows, written.fingerprint) == (ROWS, stored(DAY))
        assert other.fingerprint == stored(NEXT)

        # An upsert of half the keys keeps the other half, read back from the server.
        half = batch(kind).slice(0, ROWS // 2)
        merged = ia.publish(backend, half, upsert_settings(), window(DAY), now=NOW)
        assert (merged.rows, merged.updated, merged.fingerprint) == (ROWS, 3, stored(DAY))
        assert merged.fingerprint == written.fingerprint

        ranged = ia.publish(
            backend,
            pa.concat_tables([batch(kind), batch(kind, NEXT, 100)]),
            settings(),
            window(DAY, NEXT),
            now=NOW,
        )
        assert {k: p.fingerprint for k, p in ranged.per_partition.items()} == {
            DAY: stored(DAY),
            NEXT: stored(NEXT),
        }
        assert ranged.fingerprint == stored(DAY, NEXT)


@pytest.mark.parametrize("family", FAMILIES)
def test_duckdb_and_postgres_holding_the_same_rows_report_the_same_fingerprint(
    postgres_location: PostgresLocation, tmp_path: Path, family: str
) -> None:
    kind = FAMILIES[family]
    rows = pa.concat_tables([batch(kind), batch(kind, NEXT, 100)])
    with duckdb.connect(str(tmp_path / "warehouse.duckdb")) as conn:
        on_duckdb = ia.publish(conn, rows, settings(), window(DAY, NEXT), now=NOW)
        duckdb_table = ia.table_fingerprint(conn, "main", "trips")
    with PostgresBackend.connect(postgres_location) as backend:
        on_postgres = ia.publish(backend, rows, settings(), window(DAY, NEXT), now=NOW)
        postgres_table = ia.table_fingerprint(backend, "main", "trips")
    assert on_postgres.fingerprint == on_duckdb.fingerprint == postgres_table == duckdb_table
    assert {k: p.fingerprint for k, p in on_postgres.per_partition.items()} == {
        k: p.fingerprint for k, p in on_duckdb.per_partition.items()
    }


def test_a_column_that_rounds_on_the_server_is_fingerprinted_as_stored(
    postgres_location: PostgresLocation,
) -> None:
    with PostgresBackend.connect(postgres_location) as backend:
        first = ia.publish(backend, batch(pa.timestamp("us")), settings(), window(DAY), now=NOW)
        backend.cur.execute("ALTER TABLE main.trips ALTER COLUMN value TYPE timestamp(0)")
        backend.conn.commit()
        again = ia.publish(backend, batch(pa.timestamp("us")), settings(), window(DAY), now=NOW)
        stored = ia.table_fingerprint(backend, "main", "trips", "pickup_at", window(DAY))
    assert again.fingerprint == stored != first.fingerprint
