"""The engine-neutral schema fit: its decisions on Arrow types, and DuckDB's dialect of it."""

from datetime import datetime
from decimal import Decimal

import duckdb
import pyarrow as pa
import pytest

import idem_assets as ia
from idem_assets.lib.backends.duckdb.types import DUCKDB_TYPES
from idem_assets.lib.write.schema_fit import (
    ColumnFit,
    SchemaChange,
    conversion,
    evolved,
    fit_columns,
    refuse_lossy_values,
    schema_changes,
    stored_batch,
)
from tests.helpers import settings

from .support import publish

#: Partitioned by pickup_at, with no key: the batches below need no more columns.
BY_PICKUP = settings(metadata={"partition_expr": "pickup_at"})


class ArrowNames:
    """A dialect that stores every type as the batch has it and spells types as Arrow does."""

    engine = "Arrow"

    def stored_type(self, batch_type: pa.DataType) -> pa.DataType:
        return batch_type

    def type_sql(self, arrow_type: pa.DataType) -> str:
        return str(arrow_type)

    def sql_name(self, name: str) -> str:
        return name


@pytest.mark.parametrize(
    ("batch_type", "stored_type", "expected"),
    [
        (pa.int64(), pa.int64(), "same"),
        (pa.timestamp("us", tz="UTC"), pa.timestamp("us", tz="Etc/UTC"), "same"),
        (pa.null(), pa.float64(), "cast"),
        (pa.timestamp("ns"), pa.timestamp("us"), "cast"),
        (pa.timestamp("ns", tz="UTC"), pa.timestamp("s", tz="UTC"), "cast"),
        (pa.timestamp("us", tz="UTC"), pa.timestamp("us"), None),
        (pa.timestamp("us"), pa.timestamp("us", tz="UTC"), None),
        (pa.large_string(), pa.string(), "cast"),
        (pa.int32(), pa.int64(), "cast"),
        (pa.uint32(), pa.int64(), "cast"),
        (pa.uint64(), pa.int64(), None),
        (pa.int64(), pa.int32(), None),
        (pa.float32(), pa.float64(), "cast"),
        (pa.float64(), pa.float32(), None),
        (pa.int32(), pa.float64(), "cast"),
        (pa.int16(), pa.float32(), "cast"),
        (pa.int64(), pa.float64(), "checked"),
        (pa.int32(), pa.float32(), "checked"),
        (pa.float64(), pa.int64(), None),
        (pa.int32(), pa.decimal128(12, 2), "cast"),
        (pa.int64(), pa.decimal128(12, 2), None),
        (pa.decimal128(10, 2), pa.decimal128(12, 2), "cast"),
        (pa.decimal128(12, 2), pa.decimal128(10, 2), None),
        (pa.decimal128(10, 2), pa.decimal128(10, 3), None),
        (pa.string(), pa.int32(), None),
        (pa.date32(), pa.timestamp("us"), None),
    ],
)
def test_conversion_decides_on_arrow_types(
    batch_type: pa.DataType, stored_type: pa.DataType, expected: str | None
) -> None:
    assert conversion(batch_type, stored_type) == expected


@pytest.mark.parametrize(
    ("batch_type", "stored_type", "spelt"),
    [
        (pa.timestamp("ns"), pa.timestamp("us"), "TIMESTAMP"),
        (pa.timestamp("ms"), pa.timestamp("us"), "TIMESTAMP"),
        (
            pa.timestamp("ns", tz="UTC"),
            pa.timestamp("us", tz="Etc/UTC"),
            "TIMESTAMP WITH TIME ZONE",
        ),
        (pa.large_string(), pa.string(), "VARCHAR"),
        (pa.dictionary(pa.int32(), pa.string()), pa.string(), "VARCHAR"),
        (pa.date64(), pa.date32(), "DATE"),
        (pa.int32(), pa.int32(), "INTEGER"),
        (pa.decimal128(12, 2), pa.decimal128(12, 2), "DECIMAL(12,2)"),
    ],
)
def test_duckdb_stores_each_arrow_type_as_duckdb_reads_it(
    batch_type: pa.DataType, stored_type: pa.DataType, spelt: str
) -> None:
    assert DUCKDB_TYPES.stored_type(batch_type) == stored_type
    assert DUCKDB_TYPES.type_sql(stored_type) == spelt


def test_two_arrow_spellings_of_one_duckdb_type_fit_by_a_cast() -> None:
    batch = pa.schema(
        [
            ("pickup_at", pa.timestamp("us")),
            ("zone", pa.dictionary(pa.int32(), pa.string())),
            ("day", pa.date64()),
        ]
    )
    table = {"pickup_at": pa.timestamp("us"), "zone": pa.string(), "day": pa.date32()}
    fits = fit_columns(BY_PICKUP, "asset 'trips'", batch, table, DUCKDB_TYPES)
    assert [f.conversion for f in fits] == ["same", "cast", "cast"]


def test_the_refusal_spells_types_and_names_in_the_dialect() -> None:
    batch = pa.schema([("pickup_at", pa.timestamp("us")), ("order", pa.int32())])
    table = {"pickup_at": pa.timestamp("us"), "order": pa.int16(), "fare": pa.float64()}
    with pytest.raises(ia.SchemaMismatchError) as refused:
        fit_columns(BY_PICKUP, "asset 'trips'", batch, table, DUCKDB_TYPES)
    assert str(refused.value) == (
        "Refused to write asset 'trips': the batch does not match table main.trips: missing"
        " columns ['fare'], types that cannot hold every batch value [order: table SMALLINT,"
        " batch INTEGER]. Nothing was changed. Fix: make the batch produce the table's columns"
        " and types; or, for an intended schema change, migrate the table first, then rerun:"
        ' ALTER TABLE main.trips DROP COLUMN fare; ALTER TABLE main.trips ALTER COLUMN "order"'
        " TYPE INTEGER."
    )
    with pytest.raises(ia.SchemaMismatchError, match=r"order: table int16, batch int32"):
        fit_columns(BY_PICKUP, "asset 'trips'", batch, table, ArrowNames())


def test_a_new_table_refuses_an_untyped_column() -> None:
    batch = pa.schema([("pickup_at", pa.timestamp("us")), ("tip", pa.null())])
    with pytest.raises(ia.SchemaMismatchError, match=r"column\(s\) \['tip'\] hold only NULL"):
        fit_columns(BY_PICKUP, "asset 'trips'", batch, None, ArrowNames())


def test_lossy_values_are_found_on_the_arrow_batch_nulls_aside() -> None:
    batch = pa.table({"fare": pa.array([1, 2**53 + 1, None, -(2**63) + 1, 2**53], pa.int64())})
    fits = [ColumnFit("fare", pa.int64(), "fare", pa.float64(), "checked")]
    # Whole, and in two chunks as a streamed batch is read: the same count and examples.
    for chunks in ([batch], [batch.slice(0, 2), batch.slice(2)]):
        with pytest.raises(ia.SchemaMismatchError) as refused:
            refuse_lossy_values(
                lambda c=chunks: iter(c), fits, settings(), "asset 'trips'", DUCKDB_TYPES
            )
        text = str(refused.value)
        assert "2 value(s) of 'fare' (BIGINT) are not exactly representable as DOUBLE" in text
        assert "the type of main.trips.fare, e.g. [-9223372036854775807, 9007199254740993]" in text

    exact = pa.table({"fare": pa.array([1, 2**53, None], pa.int64())})
    refuse_lossy_values(lambda: iter([exact]), fits, settings(), "asset 'trips'")


def test_stored_batch_renames_casts_and_floors_timestamps() -> None:
    # One nanosecond before midnight, and one before the epoch, where truncation would ceil.
    moments = pa.array([1767311999999999999, -1, None], pa.timestamp("ns"))
    batch = pa.table(
        {
            "Pickup_At": moments,
            "n": pa.array([1, 2, None], pa.int32()),
            "fare": pa.array([2**53, 3, None], pa.int64()),
            "price": pa.array([Decimal("1.50"), None, Decimal("2.25")], pa.decimal128(10, 2)),
        }
    )
    fits = [
        ColumnFit("Pickup_At", pa.timestamp("ns"), "pickup_at", pa.timestamp("us"), "cast"),
        ColumnFit("n", pa.int32(), "n", pa.int64(), "cast"),
        ColumnFit("fare", pa.int64(), "fare", pa.float64(), "checked"),
        ColumnFit("price", pa.decimal128(10, 2), "price", pa.decimal128(12, 2), "cast"),
    ]
    stored = stored_batch(batch, fits)

    assert stored.schema == pa.schema(
        [
            ("pickup_at", pa.timestamp("us")),
            ("n", pa.int64()),
            ("fare", pa.float64()),
            ("price", pa.decimal128(12, 2)),
        ]
    )
    assert stored.column("pickup_at").cast(pa.int64()).to_pylist() == [1767311999999999, -1, None]
    assert stored.column("n").to_pylist() == [1, 2, None]
    assert stored.column("fare").to_pylist() == [2.0**53, 3.0, None]
    assert stored.column("price").to_pylist() == [Decimal("1.50"), None, Decimal("2.25")]


def test_stored_batch_keeps_the_last_moment_of_a_day_in_its_day_where_duckdb_rounds_it_out() -> (
    None
):
    last = pa.table({"t": pa.array([1767311999999999999], pa.timestamp("ns"))})
    fit = ColumnFit("t", pa.timestamp("ns"), "t", pa.timestamp("us"), "cast")
    floored = stored_batch(last, [fit]).column("t").to_pylist()
    assert floored == [datetime(2026, 1, 1, 23, 59, 59, 999999)]
    with duckdb.connect() as conn:
        conn.register("last", last)
        rounded = conn.execute('SELECT CAST(t AS TIMESTAMP) FROM "last"').fetchall()
    assert rounded == [(datetime(2026, 1, 2),)]


@pytest.mark.parametrize("name", ["fare\x00", ""])
def test_a_column_name_duckdb_would_alter_is_refused_before_duckdb_reads_it(name: str) -> None:
    batch = pa.table(
        {"pickup_at": pa.array([datetime(2026, 1, 1, 1)], pa.timestamp("us")), name: [1.0]}
    )
    with duckdb.connect() as conn:
        with pytest.raises(ia.InvalidIdentifierError, match="is not a plain identifier"):
            publish(conn, batch, BY_PICKUP, ["2026-01-01"])
        assert conn.execute("SELECT count(*) FROM duckdb_tables()").fetchall() == [(0,)]


def test_schema_changes_list_only_what_the_setting_allows_and_loses_nothing() -> None:
    batch = pa.schema(
        [
            ("pickup_at", pa.timestamp("us")),
            ("n", pa.int64()),
            ("ratio", pa.float64()),
            ("code", pa.string()),
            ("tip", pa.float64()),
        ]
    )
    table = {
        "pickup_at": pa.timestamp("us"),
        "N": pa.int32(),
        "ratio": pa.int64(),
        "code": pa.int32(),
    }
    both = settings(
        metadata={"partition_expr": "pickup_at", "schema_evolution": "add_columns_and_widen_types"}
    )
    changes = schema_changes(both, "asset 'trips'", batch, table, ArrowNames())

    # int64 into double may round, text into an integer column may not parse: neither listed.
    assert changes == [
        SchemaChange("widen_type", "N", pa.int64()),
        SchemaChange("add_column", "tip", pa.float64()),
    ]
    with pytest.raises(ia.SchemaMismatchError, match=r"\[ratio: table int64, batch double; code"):
        fit_columns(both, "asset 'trips'", batch, evolved(table, changes), ArrowNames())
    assert schema_changes(BY_PICKUP, "asset 'trips'", batch, table, ArrowNames()) == []
