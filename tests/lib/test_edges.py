"""Inputs at the edges of the rerun promise, each materialised for real with Dagster.

Precision that rounds a row into the next partition, a range rerun with a day missing, two
assets on one table, a named pandas index, column names that differ only in case, the
library's own names, lossless type widening and per-day metadata of a chunk.
"""

import re
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import pandas as pd
import pyarrow as pa
import pytest

import idem_assets as ia
from tests.helpers import range_tags

from .support import (
    MERGE_MD,
    OVERWRITE_MD,
    batch_asset,
    count,
    fares,
    fingerprints,
    output_metadata,
    read,
    resources,
    rows,
    run,
    trips,
    trips_asset,
    two_days,
)

RANGE = ("2026-01-01", "2026-01-03")


def plain_asset(value: Callable[[], Any], **kwargs: Any) -> dg.AssetsDefinition:
    """An unpartitioned asset written by the overwrite IO manager."""

    def compute() -> Any:
        return value()

    kwargs.setdefault("name", "t")
    return dg.asset(io_manager_key="overwrite_io_manager", **kwargs)(compute)


# 1. Precision -------------------------------------------------------------------------------------

LAST_NS = pd.Timestamp("2026-01-02") - pd.Timedelta(1, "ns")


def with_last_moment(day: str, moment: Any, unit: str | None = None) -> pd.DataFrame:
    batch = trips(day, 4)
    frame = pd.concat(
        [batch, batch.iloc[[0]].assign(trip_id=99, pickup_at=moment)], ignore_index=True
    )
    if unit:
        frame["pickup_at"] = frame["pickup_at"].astype(f"datetime64[{unit}]")
    return frame


@pytest.mark.parametrize("first_write", [True, False], ids=["table-created", "table-exists"])
def test_a_nanosecond_that_rounds_into_the_next_day_is_refused(
    tmp_path: Path, first_write: bool
) -> None:
    db = tmp_path / "w.duckdb"
    batches = {"2026-01-02": trips("2026-01-02", 4), "2026-01-01": trips("2026-01-01", 4)}
    asset = batch_asset(lambda key: batches[key])
    if not first_write:
        run([asset], db, "2026-01-01")
        run([asset], db, "2026-01-02")
    before = fingerprints(db) if db.exists() else {}

    batches["2026-01-01"] = with_last_moment("2026-01-01", LAST_NS)
    with pytest.raises(ia.StrayRowsError) as refused:
        run([asset], db, "2026-01-01")

    text = str(refused.value)
    assert "1 of 5 rows have 'pickup_at' inside the window at the batch's precision" in text
    assert "2026-01-01 23:59:59.999999999" in text and "2026-01-02 00:00:00" in text
    assert "df['pickup_at'] = df['pickup_at'].dt.floor('us')" in text
    assert (fingerprints(db) if db.exists() else {}) == before


@pytest.mark.parametrize("unit", ["us", "ns"])
@pytest.mark.parametrize(
    ("column_type", "moment", "floor"),
    [
        ("TIMESTAMP_S", pd.Timestamp("2026-01-01 23:59:59.7"), "s"),
        ("TIMESTAMP_MS", pd.Timestamp("2026-01-01 23:59:59.9996"), "ms"),
    ],
)
def test_a_value_that_rounds_up_to_a_coarser_column_is_refused(
    tmp_path: Path, column_type: str, moment: pd.Timestamp, floor: str, unit: str
) -> None:
    db = tmp_path / "w.duckdb"
    with duckdb.connect(str(db)) as conn:
        conn.execute(
            "CREATE TABLE main.trips (trip_id BIGINT, pickup_at"
            f" {column_type}, passenger_count BIGINT, fare DOUBLE)"
        )
    batches = {"2026-01-02": trips("2026-01-02", 4), "2026-01-01": trips("2026-01-01", 4)}
    asset = batch_asset(lambda key: batches[key])
    run([asset], db, "2026-01-02")
    before = fingerprints(db)

    batches["2026-01-01"] = with_last_moment("2026-01-01", moment, unit=unit)
    with pytest.raises(ia.StrayRowsError, match=f"dt.floor\\('{floor}'\\)"):
        run([asset], db, "2026-01-01")
    assert fingerprints(db) == before

    # Floored as the message says, the row stays in its day and reruns change nothing.
    floored = batches["2026-01-01"].assign(pickup_at=lambda df: df["pickup_at"].dt.floor(floor))
    batches["2026-01-01"] = floored
    for _ in range(2):
        run([asset], db, "2026-01-01")
    with read(db) as conn:
        assert [count(conn, day=d) for d in ("2026-01-01", "2026-01-02")] == [5, 4]


# 2. A range rerun with a day missing --------------------------------------------------------------


def range_days(missing: str | None = None) -> Callable[[dg.AssetExecutionContext], pd.DataFrame]:
    def source(context: dg.AssetExecutionContext) -> pd.DataFrame:
        keys = context.partition_keys
        return pd.concat([trips(k, 4) for k in keys if k != missing], ignore_index=True)

    return source


@pytest.mark.parametrize("io_manager", ["overwrite_io_manager", "merge_io_manager"])
def test_a_range_rerun_missing_one_day_is_refused(tmp_path: Path, io_manager: str) -> None:
    db = tmp_path / "w.duckdb"
    md = OVERWRITE_MD if io_manager == "overwrite_io_manager" else MERGE_MD
    run([trips_asset(io_manager, md, range_days())], db, partition_range=RANGE)
    before = fingerprints(db)

    gap = trips_asset(io_manager, md, range_days(missing="2026-01-02"))
    with pytest.raises(ia.EmptyBatchError) as refused:
        run([gap], db, partition_range=RANGE)

    assert "the batch has no rows for partition(s) ['2026-01-02'], which hold [4] rows" in str(
        refused.value
    )
    assert "metadata={'allow_empty': True}" in str(refused.value)
    assert fingerprints(db) == before

    allowed = trips_asset(io_manager, {**md, "allow_empty": True}, range_days("2026-01-02"))
    run([allowed], db, partition_range=RANGE)
    with read(db) as conn:
        assert [count(conn, day=d) for d in ("2026-01-01", "2026-01-02", "2026-01-03")] == [
            4,
            0,
            4,
        ]


# 3. Two assets, one table -------------------------------------------------------------------------


def region_asset(region: str, n: int, **kwargs: Any) -> dg.AssetsDefinition:
    return batch_asset(lambda key: trips(key, n), key_prefix=[region], **kwargs)


def test_a_key_prefix_is_the_schema_so_two_regions_keep_their_rows(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    run([region_asset("us", 5)], db, "2026-01-01")
    run([region_asset("eu", 2)], db, "2026-01-01")

    with read(db) as conn:
        assert conn.execute("SELECT count(*) FROM us.trips").fetchall() == [(5,)]
        assert conn.execute("SELECT count(*) FROM eu.trips").fetchall() == [(2,)]
    # An explicit schema in metadata still wins over the prefix.
    run([region_asset("ca", 3, metadata={**OVERWRITE_MD, "schema": "canada"})], db, "2026-01-01")
    with read(db) as conn:
        assert conn.execute("SELECT count(*) FROM canada.trips").fetchall() == [(3,)]


def test_two_assets_resolving_to_one_table_are_refused(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    one_schema = {
        "overwrite_io_manager": ia.DuckDBOverwriteIOManager(database=str(db), schema="main")
    }
    dg.materialize([region_asset("us", 5)], resources=one_schema, partition_key="2026-01-01")
    before = fingerprints(db)

    with pytest.raises(ia.ConfigurationError) as refused:
        dg.materialize([region_asset("eu", 2)], resources=one_schema, partition_key="2026-01-01")

    text = str(refused.value)
    assert "table main.trips belongs to asset 'us/trips'" in text
    assert "Refused to write asset 'eu/trips'" in text
    assert "metadata={'schema': 'eu'}" in text
    assert fingerprints(db) == before
    # The owner itself reruns as before.
    dg.materialize([region_asset("us", 5)], resources=one_schema, partition_key="2026-01-01")
    assert fingerprints(db) == before

    # A renamed asset takes the table over with the statement the message prints.
    handover = re.search(r"hand the table over first: (UPDATE .*)\.$", text)
    assert handover is not None
    with read(db) as conn:
        conn.execute(handover[1])
    dg.materialize([region_asset("eu", 2)], resources=one_schema, partition_key="2026-01-01")
    with read(db) as conn:
        assert count(conn) == 2


def test_asset_names_that_differ_only_in_case_are_refused(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    run([batch_asset(lambda key: trips(key, 5), name="trips")], db, "2026-01-01")
    before = fingerprints(db)

    with pytest.raises(ia.ConfigurationError) as refused:
        run([batch_asset(lambda key: trips(key, 2), name="Trips")], db, "2026-01-01")

    text = str(refused.value)
    assert "table main.Trips belongs to asset 'trips'" in text
    assert "DuckDB compares names without regard to case" in text
    assert fingerprints(db) == before


# 4. A named pandas index --------------------------------------------------------------------------

ZONES = pd.DataFrame(
    {"day": ["d1", "d1", "d2"], "zone": ["JFK", "SoHo", "JFK"], "fare": [10.0, 5.0, 7.5]}
)


def test_a_named_index_is_kept_as_a_column(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    by_zone = plain_asset(lambda: ZONES.groupby("zone").agg(total=("fare", "sum")), name="zones")
    by_day_zone = plain_asset(lambda: ZONES.groupby(["day", "zone"]).agg(total=("fare", "sum")))
    unnamed = plain_asset(lambda: ZONES[ZONES["fare"] > 6], name="filtered")
    run([by_zone, by_day_zone, unnamed], db)

    with read(db) as conn:
        assert rows(conn, "zones") == [("JFK", 17.5), ("SoHo", 5.0)]
        assert rows(conn, "t") == [("d1", "JFK", 10.0), ("d1", "SoHo", 5.0), ("d2", "JFK", 7.5)]
        assert rows(conn, "filtered") == [("d1", "JFK", 10.0), ("d2", "JFK", 7.5)]


def test_an_index_named_like_a_column_is_refused(tmp_path: Path) -> None:
    frame = ZONES.set_index(pd.Index([1, 2, 3], name="fare"))
    with pytest.raises(ia.SchemaMismatchError, match="reset_index\\(drop=True\\)"):
        run([plain_asset(lambda: frame)], tmp_path / "w.duckdb")


# 5. Column names that differ only in case ---------------------------------------------------------


def test_columns_that_differ_only_in_case_are_refused(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    batch = trips("2026-01-01", 4).assign(FARE=1.0)
    with pytest.raises(ia.SchemaMismatchError) as refused:
        run([batch_asset(lambda key: batch)], db, "2026-01-01")
    assert "more than one column named ['FARE', 'fare']" in str(refused.value)
    assert "without regard to case" in str(refused.value)
    assert not db.exists() or fingerprints(db) == {}


def test_a_column_spelt_in_another_case_is_stored_in_the_tables_column(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    batches = {"2026-01-01": trips("2026-01-01", 4)}
    asset = batch_asset(lambda key: batches[key])
    run([asset], db, "2026-01-01")
    batches["2026-01-01"] = trips("2026-01-01", 4).rename(columns={"fare": "Fare"})
    run([asset], db, "2026-01-01")

    with read(db) as conn:
        assert [c[0] for c in conn.execute("DESCRIBE main.trips").fetchall()] == [
            "trip_id",
            "pickup_at",
            "passenger_count",
            "fare",
        ]
        assert count(conn) == 4


# 6. The library's own names -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["idem_staged_batch", "staged", "idem_windows"])
def test_an_asset_may_have_any_name_the_library_uses_inside(tmp_path: Path, name: str) -> None:
    db = tmp_path / "w.duckdb"
    asset = batch_asset(lambda key: trips(key, 4), name=name)
    run([asset], db, "2026-01-01")
    run([asset], db, "2026-01-01")
    with read(db) as conn:
        assert conn.execute(f"SELECT count(*) FROM main.{name}").fetchall() == [(4,)]


# 7. Type widening ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table_type", "batch_type", "values"),
    [
        (pa.float64(), pa.int64(), [12, 15]),
        (pa.decimal128(12, 2), pa.decimal128(10, 2), [Decimal("12.50"), Decimal("3.25")]),
        (pa.int64(), pa.int32(), [12, 15]),
        (pa.float64(), pa.int64(), [2**53, -(2**53)]),
    ],
    ids=["int64-into-double", "decimal-10-2-into-12-2", "int32-into-bigint", "int64-at-2^53"],
)
def test_a_lossless_widening_is_accepted(
    tmp_path: Path, table_type: pa.DataType, batch_type: pa.DataType, values: list[Any]
) -> None:
    db = tmp_path / "w.duckdb"
    asset = batch_asset(two_days(fares([1, 2], table_type), fares(values, batch_type)))
    run([asset], db, "2026-01-01")
    with read(db) as conn:
        types = conn.execute("DESCRIBE main.trips").fetchall()
    run([asset], db, "2026-01-02")

    with read(db) as conn:
        assert conn.execute("DESCRIBE main.trips").fetchall() == types
        stored = conn.execute(
            "SELECT fare FROM main.trips WHERE pickup_at >= '2026-01-02' ORDER BY trip_id"
        ).fetchall()
    assert [r[0] for r in stored] == values


@pytest.mark.parametrize(
    ("table_type", "batch_type", "values", "problem", "alter"),
    [
        (pa.int64(), pa.float64(), [1.5, 2.0], "fare: table BIGINT, batch DOUBLE", "DOUBLE"),
        (
            pa.decimal128(10, 2),
            pa.decimal128(12, 2),
            [Decimal("1.50")],
            "fare: table DECIMAL(10,2), batch DECIMAL(12,2)",
            "DECIMAL(12,2)",
        ),
        (pa.int32(), pa.string(), ["3"], "fare: table INTEGER, batch VARCHAR", "VARCHAR"),
    ],
    ids=["double-into-bigint", "decimal-12-2-into-10-2", "varchar-into-integer"],
)
def test_a_lossy_type_change_is_refused_with_an_alter_that_works(
    tmp_path: Path,
    table_type: pa.DataType,
    batch_type: pa.DataType,
    values: list[Any],
    problem: str,
    alter: str,
) -> None:
    db = tmp_path / "w.duckdb"
    asset = batch_asset(two_days(fares([1], table_type), fares(values, batch_type)))
    run([asset], db, "2026-01-01")
    before = fingerprints(db)

    with pytest.raises(ia.SchemaMismatchError) as refused:
        run([asset], db, "2026-01-02")

    text = str(refused.value)
    statement = f"ALTER TABLE main.trips ALTER COLUMN fare TYPE {alter}"
    assert problem in text and statement in text
    assert fingerprints(db) == before
    with read(db) as conn:
        conn.execute(statement)
    run([asset], db, "2026-01-02")


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda frame: frame.assign(tip=1.5), "extra columns ['tip']"),
        (lambda frame: frame.drop(columns=["fare"]), "missing columns ['fare']"),
        (lambda frame: frame.assign(order=1), "extra columns ['order']"),
    ],
    ids=["extra", "missing", "extra-reserved-word"],
)
def test_the_printed_migration_works(
    tmp_path: Path, change: Callable[[pd.DataFrame], pd.DataFrame], problem: str
) -> None:
    db = tmp_path / "w.duckdb"
    asset = batch_asset(lambda key: change(trips(key, 4)) if key == "2026-01-02" else trips(key, 4))
    run([asset], db, "2026-01-01")

    with pytest.raises(ia.SchemaMismatchError) as refused:
        run([asset], db, "2026-01-02")

    text = str(refused.value)
    assert problem in text
    statements = text.split("migrate the table first, then rerun: ")[1].rstrip(".").split("; ")
    with read(db) as conn:
        for statement in statements:
            conn.execute(statement)
    run([asset], db, "2026-01-02")
    with read(db) as conn:
        assert count(conn, day="2026-01-02") == 4


def test_an_int64_beyond_double_precision_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    asset = batch_asset(two_days(fares([1.0], pa.float64()), fares([2**53 + 1], pa.int64())))
    run([asset], db, "2026-01-01")
    before = fingerprints(db)

    with pytest.raises(ia.SchemaMismatchError) as refused:
        run([asset], db, "2026-01-02")

    text = str(refused.value)
    assert "1 value(s) of 'fare' (BIGINT) are not exactly representable as DOUBLE" in text
    assert "9007199254740993" in text
    assert "df['fare'] = df['fare'].astype('float64')" in text
    assert fingerprints(db) == before


# 8. Per-day metadata of a chunk -------------------------------------------------------------------


def test_each_day_of_a_chunk_carries_its_own_counts(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    week = ("2026-01-01", "2026-01-07")
    version = {"n": 10}

    def source(context: dg.AssetExecutionContext) -> pd.DataFrame:
        frames = []
        for i, key in enumerate(context.partition_keys):
            # The rerun drops i rows of day i and adds none: day i loses exactly i rows.
            frames.append(trips(key, version["n"] - (i if version["n"] == 9 else 0)))
        return pd.concat(frames, ignore_index=True)

    asset = trips_asset("merge_io_manager", MERGE_MD, source)
    with dg.instance_for_test() as instance:
        dg.materialize(
            [asset],
            resources=resources(db),
            instance=instance,
            tags=range_tags(week[0], week[1]),
        )
        version["n"] = 9
        dg.materialize(
            [asset],
            resources=resources(db),
            instance=instance,
            tags=range_tags(week[0], week[1]),
        )
        day5 = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("trips"), asset_partitions=["2026-01-05"]),
            limit=1,
        ).records[0]
        assert day5.asset_materialization is not None
        md = {k: v.value for k, v in day5.asset_materialization.metadata.items()}

    # Day 5 (index 4) kept 9 - 4 = 5 of its 10 rows: 5 updated, 5 deleted, none inserted.
    assert md["dagster/row_count"] == 5
    assert (md["rows_inserted"], md["rows_updated"], md["rows_deleted"]) == (0, 5, 5)
    assert md["partitions_written"] == 1
    assert md["window"] == "[2026-01-05T00:00:00+00:00, 2026-01-06T00:00:00+00:00)"
    # The chunk's totals are named as such.
    assert md["range_partitions_written"] == 7
    assert md["range_row_count"] == sum(9 - i for i in range(7))
    assert (md["range_rows_updated"], md["range_rows_deleted"]) == (42, 28)
    assert md["range_window"] == "[2026-01-01T00:00:00+00:00, 2026-01-08T00:00:00+00:00)"


def test_a_single_day_keeps_its_metadata(tmp_path: Path) -> None:
    md = output_metadata(
        run(
            [trips_asset("overwrite_io_manager", OVERWRITE_MD)], tmp_path / "w.duckdb", "2026-01-01"
        )
    )
    assert "range_row_count" not in md["2026-01-01"]
    assert md["2026-01-01"]["partitions_written"] == 1
