"""Every guard refuses an unsafe batch before anything is written, and says how to fix it."""

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import pandas as pd
import pytest

import idem_assets as ia
from idem_assets.lib.model.identifiers import validate_identifier

from .support import (
    DAILY,
    DAYS,
    NOW,
    TRIPS_METADATA,
    count,
    fingerprint,
    partition_fingerprints,
    publish,
    read,
    rows,
    run,
    settings,
    trips,
    trips_asset,
)


@pytest.fixture
def loaded(tmp_path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """A warehouse file holding three days of 1,000 trips, written by the merge strategy."""
    with duckdb.connect(str(tmp_path / "warehouse.duckdb")) as conn:
        for day in DAYS:
            publish(conn, trips(day), settings("merge"), [day])
        yield conn


def with_stray_row(day: str, stray_day: str) -> pd.DataFrame:
    stray = trips(stray_day, 1, first_id=99_999_999)
    return pd.concat([trips(day), stray], ignore_index=True)


def with_null(column: str, dtype: str | None = None) -> pd.DataFrame:
    batch = trips("2026-01-03")
    if dtype:
        batch[column] = batch[column].astype(dtype)
    batch.loc[7, column] = None
    return batch


@dataclass(frozen=True)
class Case:
    """A batch that one guard must refuse, and what the refusal must say."""

    batch: Callable[[], pd.DataFrame]
    error: type[Exception]
    fixes: tuple[str, ...]
    mode: str = "merge"
    metadata: dict[str, Any] = field(default_factory=lambda: dict(TRIPS_METADATA))
    day: str = "2026-01-03"


CASES = {
    "stray-row": Case(
        lambda: with_stray_row("2026-01-03", "2026-01-01"),
        ia.StrayRowsError,
        ("1 of 1001 rows", "context.partition_time_window", "2026-01-01 00:00:00"),
        mode="overwrite",
    ),
    "duplicate-key": Case(
        lambda: pd.concat([trips("2026-01-03"), trips("2026-01-03").iloc[[5]]]),
        ia.DuplicateKeyError,
        ("'dedupe_order_by': ['updated_at']", "'primary_key': ['trip_id']"),
    ),
    "null-key": Case(
        lambda: with_null("trip_id", "Int64"), ia.NullValueError, ("NULL in key", "fill or drop")
    ),
    "null-partition": Case(
        lambda: with_null("pickup_at"),
        ia.NullValueError,
        ("NULL in partition column 'pickup_at'", "drop or date those rows"),
    ),
    "empty-batch": Case(
        lambda: trips("2026-01-03").iloc[:0],
        ia.EmptyBatchError,
        ("holds 1000 rows", "metadata={'allow_empty': True}"),
        mode="overwrite",
    ),
    "missing-column": Case(
        lambda: trips("2026-01-03").drop(columns=["fare"]),
        ia.SchemaMismatchError,
        ("missing columns ['fare']", "ALTER TABLE main.trips"),
    ),
    "extra-column": Case(
        lambda: trips("2026-01-03").assign(tip=1.0),
        ia.SchemaMismatchError,
        ("extra columns ['tip']", "ALTER TABLE main.trips ADD COLUMN"),
    ),
    "integer-to-text": Case(
        lambda: trips("2026-01-03").astype({"passenger_count": str}),
        ia.SchemaMismatchError,
        (
            "passenger_count: table BIGINT, batch VARCHAR",
            "ALTER TABLE main.trips ALTER COLUMN passenger_count TYPE VARCHAR",
        ),
        mode="overwrite",
    ),
    "partition-column-as-text": Case(
        lambda: trips("2026-01-03").astype({"pickup_at": str}),
        ia.SchemaMismatchError,
        ("is VARCHAR, not DATE or TIMESTAMP", "pd.to_datetime(df['pickup_at'])"),
    ),
    "tz-aware-into-naive": Case(
        lambda: trips("2026-01-03").assign(
            pickup_at=lambda df: df["pickup_at"].dt.tz_localize("UTC")
        ),
        ia.SchemaMismatchError,
        ("pickup_at: table TIMESTAMP, batch TIMESTAMPTZ", "tz_localize(None)"),
    ),
    "key-column-absent": Case(
        trips("2026-01-03").copy,
        ia.SchemaMismatchError,
        ("no column(s) ['ride_id']", "correct the metadata"),
        metadata={"partition_expr": "pickup_at", "primary_key": ["ride_id"]},
    ),
    "dedupe-column-absent": Case(
        lambda: trips("2026-01-03"),
        ia.SchemaMismatchError,
        ("no column(s) ['updated_at']",),
        metadata={**TRIPS_METADATA, "dedupe_order_by": ["updated_at"]},
    ),
    "key-in-another-partition": Case(
        # trip 20260101_0003 is re-dated into 2026-01-03: it would leave 2026-01-01 behind.
        lambda: trips("2026-01-03").assign(
            trip_id=lambda df: df["trip_id"].where(df.index != 3, 20260101_0003)
        ),
        ia.KeyOutsideWindowError,
        ("1 key(s) of the batch already exist in other partitions", "trip_id=202601010003"),
    ),
    "injected-column-name": Case(
        lambda: trips("2026-01-03").rename(columns={"fare": 'fare"; DROP TABLE trips; --'}),
        ia.InvalidIdentifierError,
        ("not a plain identifier",),
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_guard_refuses_names_the_fix_and_changes_nothing(
    loaded: duckdb.DuckDBPyConnection, case: Case
) -> None:
    before = partition_fingerprints(loaded)

    with pytest.raises(case.error) as refused:
        publish(loaded, case.batch(), settings(case.mode, case.metadata), [case.day])

    message = str(refused.value)
    for fix in case.fixes:
        assert fix in message
    if case.error is not ia.InvalidIdentifierError:
        assert message.startswith("Refused to write asset 'trips', partition 2026-01-03")
    assert partition_fingerprints(loaded) == before
    assert count(loaded) == 3000
    # The connection is left clean: the next, valid publish goes through.
    assert publish(loaded, trips("2026-01-03"), settings("merge"), ["2026-01-03"]).updated == 1000


def test_empty_batch_is_accepted_with_allow_empty(loaded: duckdb.DuckDBPyConnection) -> None:
    before = partition_fingerprints(loaded)
    metadata = {**TRIPS_METADATA, "allow_empty": True}

    result = publish(
        loaded, trips("2026-01-03").iloc[:0], settings("overwrite", metadata), [DAYS[2]]
    )

    assert (result.rows, result.inserted, result.deleted) == (0, 0, 1000)
    assert count(loaded, day="2026-01-03") == 0
    assert partition_fingerprints(loaded)[:2] == before[:2]


def test_reordered_columns_are_stored_by_name(loaded: duckdb.DuckDBPyConnection) -> None:
    batch = trips("2026-01-03")
    reordered = batch[["fare", "passenger_count", "trip_id", "pickup_at"]]
    before = fingerprint(loaded, "trips", "2026-01-03")

    publish(loaded, reordered, settings("overwrite"), ["2026-01-03"])

    assert fingerprint(loaded, "trips", "2026-01-03") == before
    first = loaded.execute(
        "SELECT trip_id, passenger_count, fare FROM main.trips ORDER BY trip_id LIMIT 1 OFFSET 2000"
    ).fetchall()
    assert first == [(202601030000, 1, 5.0)]


def test_stray_row_in_a_past_partition_is_refused_through_the_io_manager(tmp_path: Path) -> None:
    db = tmp_path / "warehouse.duckdb"
    batches = {day: trips(day) for day in DAYS}
    asset = trips_asset("overwrite_io_manager", source=lambda ctx: batches[ctx.partition_key])
    for day in DAYS:
        run([asset], db, day)
    with read(db) as conn:
        before = partition_fingerprints(conn)

    # One row of the late file is dated 2026-01-01: a dynamic overwrite would cut that day to it.
    batches["2026-01-03"] = with_stray_row("2026-01-03", "2026-01-01")
    with pytest.raises(ia.StrayRowsError, match="1 of 1001 rows have 'pickup_at' outside"):
        run([asset], db, "2026-01-03")

    with read(db) as conn:
        assert count(conn, day="2026-01-01") == 1000
        assert partition_fingerprints(conn) == before


# Configuration -----------------------------------------------------------------------------------


def test_partitioned_asset_without_partition_expr_is_a_configuration_error(
    tmp_path: Path,
) -> None:
    with pytest.raises(ia.ConfigurationError, match=r"metadata=\{'partition_expr': 'pickup_at'\}"):
        run([trips_asset("overwrite_io_manager", metadata={})], tmp_path / "w.duckdb", DAYS[0])
    with read(tmp_path / "w.duckdb") as conn:
        assert fingerprint(conn) is None


def test_merge_without_primary_key_is_a_configuration_error(tmp_path: Path) -> None:
    asset = trips_asset("merge_io_manager", metadata={"partition_expr": "pickup_at"})
    with pytest.raises(ia.ConfigurationError, match=r"metadata=\{'primary_key': \['trip_id'\]\}"):
        run([asset], tmp_path / "w.duckdb", DAYS[0])
    with read(tmp_path / "w.duckdb") as conn:
        assert fingerprint(conn) is None


def test_dedupe_order_by_without_primary_key_is_a_configuration_error() -> None:
    with pytest.raises(ia.ConfigurationError, match="needs 'primary_key' too"):
        settings("overwrite", {"partition_expr": "pickup_at", "dedupe_order_by": ["updated_at"]})


INJECTIONS = {
    "schema": {"schema": "main; DROP TABLE trips"},
    "partition_expr": {"partition_expr": "pickup_at) OR (1=1"},
    "primary_key": {"primary_key": ['trip_id" = 1; --']},
    "dedupe_order_by": {"primary_key": ["trip_id"], "dedupe_order_by": ["updated_at DESC; --"]},
    "allow_runtime_columns": {"primary_key": ["trip_id"], "allow_runtime_columns": ["a'b"]},
}


@pytest.mark.parametrize("metadata", INJECTIONS.values(), ids=INJECTIONS.keys())
def test_injection_looking_metadata_values_are_refused(metadata: dict[str, Any]) -> None:
    with pytest.raises(ia.InvalidIdentifierError, match="not a plain identifier"):
        settings("merge", {"partition_expr": "pickup_at", **metadata})


def test_injection_looking_table_name_is_refused() -> None:
    with pytest.raises(ia.InvalidIdentifierError, match="table name"):
        ia.resolve_settings(
            asset_key=dg.AssetKey(['trips"; DROP TABLE trips; --']),
            metadata=TRIPS_METADATA,
            mode="overwrite",
            default_schema="main",
            partitioned=True,
        )


def test_injection_looking_schema_is_refused_through_the_io_manager(tmp_path: Path) -> None:
    asset = trips_asset(metadata={**TRIPS_METADATA, "schema": 'x"; DROP TABLE trips; --'})
    with pytest.raises(ia.InvalidIdentifierError, match="schema"):
        run([asset], tmp_path / "w.duckdb", DAYS[0])


# Run-time values ---------------------------------------------------------------------------------


@pytest.fixture
def empty(tmp_path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    with duckdb.connect(str(tmp_path / "fresh.duckdb")) as conn:
        yield conn


def with_loaded_at(stamp: pd.Timestamp) -> pd.DataFrame:
    return trips("2026-01-02").assign(loaded_at=stamp)


def uuids(factory: Callable[[int], uuid.UUID]) -> pd.DataFrame:
    batch = trips("2026-01-02")
    return batch.assign(row_uuid=[str(factory(i)) for i in batch["trip_id"]])


def test_a_load_timestamp_for_a_past_window_is_refused(empty: duckdb.DuckDBPyConnection) -> None:
    batch = with_loaded_at(pd.Timestamp(NOW).tz_localize(None))
    with pytest.raises(ia.RuntimeValueError, match=r"'allow_runtime_columns': \['loaded_at'\]"):
        publish(empty, batch, settings("merge"), ["2026-01-02"])
    assert fingerprint(empty) is None


def test_a_load_timestamp_is_refused_against_the_wall_clock_too(
    empty: duckdb.DuckDBPyConnection,
) -> None:
    batch = with_loaded_at(pd.Timestamp.now(tz="UTC"))
    with pytest.raises(ia.RuntimeValueError, match="is the time of this run"):
        publish(empty, batch, settings("merge"), ["2026-01-02"], now=None)


def test_a_timestamp_from_the_data_is_not_a_runtime_value(
    empty: duckdb.DuckDBPyConnection,
) -> None:
    batch = with_loaded_at(pd.Timestamp(NOW).tz_localize(None) - timedelta(days=30))
    assert publish(empty, batch, settings("merge"), ["2026-01-02"]).rows == 1000


def test_uuid4_strings_are_refused(empty: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(ia.RuntimeValueError, match="column 'row_uuid' holds random"):
        publish(empty, uuids(lambda _: uuid.uuid4()), settings("merge"), ["2026-01-02"])
    assert fingerprint(empty) is None


def test_uuid5_strings_are_accepted_and_stable(empty: duckdb.DuckDBPyConnection) -> None:
    def uuid5(trip_id: int) -> uuid.UUID:
        return uuid.uuid5(uuid.NAMESPACE_URL, f"trip/{trip_id}")

    first = publish(empty, uuids(uuid5), settings("merge"), ["2026-01-02"])
    second = publish(empty, uuids(uuid5), settings("merge"), ["2026-01-02"])
    assert first.fingerprint == second.fingerprint


@pytest.mark.parametrize("column", ["loaded_at", "row_uuid"])
def test_allow_runtime_columns_lets_a_declared_column_through(
    empty: duckdb.DuckDBPyConnection, column: str
) -> None:
    if column == "loaded_at":
        batch = with_loaded_at(pd.Timestamp(NOW).tz_localize(None))
    else:
        batch = uuids(lambda _: uuid.uuid4())
    metadata = {**TRIPS_METADATA, "allow_runtime_columns": [column]}
    assert publish(empty, batch, settings("merge", metadata), ["2026-01-02"]).rows == 1000
    assert len(rows(empty)) == 1000


def test_a_current_window_may_hold_current_timestamps(empty: duckdb.DuckDBPyConnection) -> None:
    # While the partition is still open, rows stamped "now" are real data, not load stamps.
    today = NOW.date().isoformat()
    batch = trips(today, 10).assign(pickup_at=pd.Timestamp(NOW).tz_localize(None))
    assert publish(empty, batch, settings("merge"), [today]).rows == 10


def test_an_empty_upsert_without_deletes_changes_nothing_and_is_accepted(
    loaded: duckdb.DuckDBPyConnection,
) -> None:
    before = partition_fingerprints(loaded)
    metadata = {**TRIPS_METADATA, "primary_key": ["trip_id"], "delete_missing": False}

    result = publish(loaded, trips("2026-01-03").iloc[:0], settings("merge", metadata), [DAYS[2]])

    assert (result.inserted, result.updated, result.deleted) == (0, 0, 0)
    assert partition_fingerprints(loaded) == before


def test_an_empty_replacing_merge_is_refused(loaded: duckdb.DuckDBPyConnection) -> None:
    before = partition_fingerprints(loaded)
    metadata = {**TRIPS_METADATA, "primary_key": ["trip_id"]}

    with pytest.raises(ia.EmptyBatchError, match="allow_empty"):
        publish(loaded, trips("2026-01-03").iloc[:0], settings("merge", metadata), [DAYS[2]])
    assert partition_fingerprints(loaded) == before


# Column names ------------------------------------------------------------------------------------

#: Names that are not plain identifiers, however they are spelt.
NOT_IDENTIFIERS = {
    "trailing-newline": "fare\n",
    "leading-newline": "\nfare",
    "space": "fare amount",
    "double-quote": 'fare"',
    "single-quote": "fare'",
    "tab": "fare\t",
    "dot": "trips.fare",
    "hyphen": "fare-usd",
    "leading-digit": "1fare",
    "too-long": "f" * 64,
}


@pytest.mark.parametrize("name", NOT_IDENTIFIERS.values(), ids=NOT_IDENTIFIERS.keys())
def test_a_batch_column_that_is_not_a_plain_identifier_is_refused_through_the_io_manager(
    tmp_path: Path, name: str
) -> None:
    def renamed(context: dg.AssetExecutionContext) -> pd.DataFrame:
        return trips(context.partition_key).rename(columns={"fare": name})

    db = tmp_path / "w.duckdb"
    with pytest.raises(ia.InvalidIdentifierError, match="Fix: rename the column"):
        run([trips_asset(source=renamed)], db, DAYS[0])
    with read(db) as conn:
        assert fingerprint(conn) is None


@pytest.mark.parametrize("name", ["fare\x00", "", None, 7, "fare\u200b", "fare\u00a0"])
def test_validate_identifier_refuses_names_the_engine_would_alter(name: object) -> None:
    with pytest.raises(ia.InvalidIdentifierError, match="Fix: rename the column"):
        validate_identifier(name, "column")


def test_column_names_in_any_script_are_stored_and_read_back(tmp_path: Path) -> None:
    names = {"fare": "tarifa_é", "passenger_count": "乗客数", "trip_id": "идентификатор"}
    metadata = {"partition_expr": "pickup_at", "primary_key": ["идентификатор"]}

    def renamed(context: dg.AssetExecutionContext) -> pd.DataFrame:
        return trips(context.partition_key).rename(columns=names)

    @dg.asset(
        partitions_def=DAILY,
        io_manager_key="io_manager",
        metadata={"partition_expr": "pickup_at"},
    )
    def fares(trips: pd.DataFrame) -> pd.DataFrame:
        """Fares read back by their non-ASCII names."""
        return trips[["идентификатор", "pickup_at", "tarifa_é"]]

    assets = [trips_asset("merge_io_manager", metadata, renamed), fares]
    db = tmp_path / "w.duckdb"

    run(assets, db, DAYS[0])
    with read(db) as conn:
        once = rows(conn), rows(conn, "fares")
    run(assets, db, DAYS[0])

    with read(db) as conn:
        assert (rows(conn), rows(conn, "fares")) == once
        assert len(once[1]) == 1000
        described = conn.execute("DESCRIBE main.fares").fetchall()
        assert [r[0] for r in described] == ["идентификатор", "pickup_at", "tarifa_é"]
        assert conn.execute('SELECT sum("tarifa_é") FROM fares').fetchall() == [
            (trips(DAYS[0])["fare"].sum(),)
        ]


MULTI_PARTITION_EXPR = {"date": "pickup_at", "region": "region"}


def test_a_dict_partition_expr_on_a_one_dimensional_asset_names_the_column_form(
    tmp_path: Path,
) -> None:
    asset = trips_asset(metadata={"partition_expr": MULTI_PARTITION_EXPR})
    db = tmp_path / "w.duckdb"
    with pytest.raises(ia.ConfigurationError) as refused:
        run([asset], db, DAYS[0])
    assert "the form for a dg.MultiPartitionsDefinition" in str(refused.value)
    assert "metadata={'partition_expr': 'pickup_at'}" in str(refused.value)
    with read(db) as conn:
        assert fingerprint(conn) is None


def test_a_dict_partition_expr_is_refused_when_an_audited_asset_is_defined() -> None:
    refusal = r"the form for a dg\.MultiPartitionsDefinition"
    with pytest.raises(ia.ConfigurationError, match=refusal):

        @ia.audited_asset(partitions_def=DAILY, metadata={"partition_expr": MULTI_PARTITION_EXPR})
        def trips(context: dg.AssetExecutionContext) -> pd.DataFrame:
            """Trips."""
            return pd.DataFrame()
