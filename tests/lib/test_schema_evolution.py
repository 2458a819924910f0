"""Opt-in schema evolution: new columns and lossless widening in the publish's own transaction.

Each test materialises for real into a DuckDB file: a first day creates the table, a second day's
batch drifts. What the asset opted into is applied with the publish; anything lossy is refused
with the migration to run, and a refused or crashed publish leaves the table as it was.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

import idem_assets as ia
from idem_assets.lib.write.publish import STAGE_HOOK
from tests.helpers import NOW, settings, window

from .support import (
    MERGE_MD,
    OVERWRITE_MD,
    batch_asset,
    fares,
    fingerprints,
    read,
    run,
    two_days,
)

DAY_1, DAY_2 = "2026-01-01", "2026-01-02"


def evolving(mode: str, md: dict[str, Any] | None = None) -> dict[str, Any]:
    """The asset metadata of ``io_manager`` with ``schema_evolution`` set to ``mode``."""
    return {**(md or OVERWRITE_MD), "schema_evolution": mode}


def with_tip(batch: Callable[[str], pa.Table]) -> Callable[[str], pa.Table]:
    """``batch`` with a ``tip`` column: 0.5 per trip."""

    def tipped(key: str) -> pa.Table:
        table = batch(key)
        return table.append_column("tip", pa.array([0.5] * table.num_rows, pa.float64()))

    return tipped


def columns(db: Path) -> list[tuple[str, str]]:
    with read(db) as conn:
        return [(r[0], r[1]) for r in conn.execute("DESCRIBE main.trips").fetchall()]


def stored(db: Path, *names: str) -> list[tuple]:
    with read(db) as conn:
        select = ", ".join(["CAST(pickup_at AS DATE)::VARCHAR", *names])
        return conn.execute(f"SELECT {select} FROM main.trips ORDER BY pickup_at").fetchall()


@pytest.mark.parametrize(
    ("io_manager", "md"),
    [("overwrite_io_manager", OVERWRITE_MD), ("merge_io_manager", MERGE_MD)],
    ids=["overwrite", "merge"],
)
def test_a_new_column_is_added_and_the_old_rows_hold_null(
    tmp_path: Path, io_manager: str, md: dict[str, Any]
) -> None:
    db = tmp_path / "w.duckdb"
    day = fares([10.0, 20.0], pa.float64())
    asset = batch_asset(
        two_days(day, with_tip(day)), io_manager, metadata=evolving("add_columns", md)
    )
    run([asset], db, DAY_1)

    run([asset], db, DAY_2)

    assert columns(db) == [
        ("trip_id", "BIGINT"),
        ("pickup_at", "TIMESTAMP"),
        ("fare", "DOUBLE"),
        ("tip", "DOUBLE"),
    ]
    assert stored(db, "trip_id", "fare", "tip") == [
        (DAY_1, 100, 10.0, None),
        (DAY_1, 101, 20.0, None),
        (DAY_2, 200, 10.0, 0.5),
        (DAY_2, 201, 20.0, 0.5),
    ]


@pytest.mark.parametrize(
    ("table_type", "batch_type", "values", "widened"),
    [
        (pa.int32(), pa.int64(), [2**40, -(2**40)], "BIGINT"),
        (
            pa.decimal128(10, 2),
            pa.decimal128(12, 2),
            [Decimal("1234567890.25"), Decimal("-0.50")],
            "DECIMAL(12,2)",
        ),
        (pa.int32(), pa.float64(), [1.5, 2.25], "DOUBLE"),
        (pa.float32(), pa.float64(), [0.1, 1e300], "DOUBLE"),
    ],
    ids=["int-to-bigint", "decimal-10-2-to-12-2", "int-to-double", "float-to-double"],
)
def test_a_lossless_widening_is_applied_and_every_value_kept(
    tmp_path: Path, table_type: pa.DataType, batch_type: pa.DataType, values: list, widened: str
) -> None:
    db = tmp_path / "w.duckdb"
    first = [Decimal("1.25"), Decimal("2.50")] if pa.types.is_decimal(table_type) else [1, 2]
    asset = batch_asset(
        two_days(fares(first, table_type), fares(values, batch_type)),
        metadata=evolving("widen_types"),
    )
    run([asset], db, DAY_1)

    run([asset], db, DAY_2)

    assert dict(columns(db))["fare"] == widened
    assert stored(db, "fare") == [(DAY_1, v) for v in first] + [(DAY_2, v) for v in values]


def test_a_rerun_after_the_evolution_changes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    day = fares([10, 20], pa.int32())
    asset = batch_asset(
        two_days(day, with_tip(fares([2**40, 5], pa.int64()))),
        metadata=evolving("add_columns_and_widen_types"),
    )
    run([asset], db, DAY_1)
    run([asset], db, DAY_2)
    after = fingerprints(db)

    run([asset], db, DAY_2)

    assert fingerprints(db) == after
    assert columns(db) == [
        ("trip_id", "BIGINT"),
        ("pickup_at", "TIMESTAMP"),
        ("fare", "BIGINT"),
        ("tip", "DOUBLE"),
    ]
    assert stored(db, "fare", "tip") == [
        (DAY_1, 10, None),
        (DAY_1, 20, None),
        (DAY_2, 2**40, 0.5),
        (DAY_2, 5, 0.5),
    ]


@pytest.mark.parametrize(
    ("table_type", "first", "batch_type", "values", "problem", "migration"),
    [
        (
            pa.decimal128(10, 2),
            [Decimal("1.25")],
            pa.decimal128(12, 1),
            [Decimal("1.5")],
            "fare: table DECIMAL(10,2), batch DECIMAL(12,1)",
            "ALTER TABLE main.trips ALTER COLUMN fare TYPE DECIMAL(12,1)",
        ),
        (
            pa.int64(),
            [2**53 + 1],
            pa.float64(),
            [1.5],
            "fare: table BIGINT, batch DOUBLE",
            "ALTER TABLE main.trips ALTER COLUMN fare TYPE DOUBLE",
        ),
        (
            pa.int32(),
            [1],
            pa.string(),
            ["1"],
            "fare: table INTEGER, batch VARCHAR",
            "ALTER TABLE main.trips ALTER COLUMN fare TYPE VARCHAR",
        ),
    ],
    ids=["decimal-scale-narrows", "bigint-to-double-may-round", "integer-to-text"],
)
def test_a_lossy_type_change_is_still_refused_with_its_migration(
    tmp_path: Path,
    table_type: pa.DataType,
    first: list,
    batch_type: pa.DataType,
    values: list,
    problem: str,
    migration: str,
) -> None:
    db = tmp_path / "w.duckdb"
    asset = batch_asset(
        two_days(with_tip(fares(first, table_type)), fares(values, batch_type)),
        metadata=evolving("add_columns_and_widen_types"),
    )
    run([asset], db, DAY_1)
    before, types = fingerprints(db), columns(db)

    with pytest.raises(ia.SchemaMismatchError) as refused:
        run([asset], db, DAY_2)

    text = str(refused.value)
    assert f"types that cannot hold every batch value [{problem}]" in text
    # The batch also drops tip, which no setting allows: still refused, with its own statement.
    assert text.endswith(
        f"migrate the table first, then rerun: ALTER TABLE main.trips DROP COLUMN tip; {migration}."
    )
    assert "missing columns ['tip']" in text and "schema_evolution" not in text
    assert fingerprints(db) == before and columns(db) == types


def test_a_dropped_column_is_refused_and_the_new_one_not_added(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    first = fares([10.0], pa.float64())

    def drifted(key: str) -> pa.Table:
        return with_tip(first)(key).drop_columns(["fare"])

    asset = batch_asset(two_days(first, drifted), metadata=evolving("add_columns"))
    run([asset], db, DAY_1)
    before = fingerprints(db)

    with pytest.raises(ia.SchemaMismatchError) as refused:
        run([asset], db, DAY_2)

    assert str(refused.value) == (
        f"Refused to write asset 'trips', partition {DAY_2}: the batch does not match table"
        " main.trips: missing columns ['fare']. Nothing was changed. Fix: make the batch produce"
        " the table's columns and types; or, for an intended schema change, migrate the table"
        " first, then rerun: ALTER TABLE main.trips DROP COLUMN fare."
    )
    assert fingerprints(db) == before


def test_a_refusal_by_another_guard_adds_no_column(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    first = fares([10.0], pa.float64())
    asset = batch_asset(two_days(first, with_tip(first)), metadata=evolving("add_columns"))
    run([asset], db, DAY_1)
    before = fingerprints(db)

    # Day 2's asset returns day 1's rows: stray rows, refused after the fit decided to add tip.
    stray = batch_asset(lambda key: with_tip(first)(DAY_1), metadata=evolving("add_columns"))
    with pytest.raises(ia.StrayRowsError):
        run([stray], db, DAY_2)

    assert fingerprints(db) == before


class Crash(Exception):
    """Raised by the stage hook, inside the publish transaction."""


@contextmanager
def crash_at(stage: str) -> Iterator[list[str]]:
    """Make every publish in this block raise at ``stage``; yields the stages reached."""
    reached: list[str] = []

    def hook(name: str) -> None:
        reached.append(name)
        if name == stage:
            raise Crash(f"crash at {stage}")

    token = STAGE_HOOK.set(hook)
    try:
        yield reached
    finally:
        STAGE_HOOK.reset(token)


def test_a_crash_after_the_alter_leaves_the_old_schema(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    asset = batch_asset(
        two_days(fares([1, 2], pa.int32()), with_tip(fares([2**40], pa.int64()))),
        metadata=evolving("add_columns_and_widen_types"),
    )
    run([asset], db, DAY_1)
    before, types = fingerprints(db), columns(db)

    with crash_at("deleted") as reached:
        result = run([asset], db, DAY_2, raise_on_error=False)

    # The ALTERs ran after "guards_passed"; the crash came after them, before the insert.
    assert not result.success and reached == ["guards_passed", "deleted"]
    assert (
        columns(db)
        == types
        == [
            ("trip_id", "BIGINT"),
            ("pickup_at", "TIMESTAMP"),
            ("fare", "INTEGER"),
        ]
    )
    assert fingerprints(db) == before

    run([asset], db, DAY_2)
    assert dict(columns(db)) == {
        "trip_id": "BIGINT",
        "pickup_at": "TIMESTAMP",
        "fare": "BIGINT",
        "tip": "DOUBLE",
    }


def test_the_strict_refusal_names_the_setting_that_would_evolve(tmp_path: Path) -> None:
    db = tmp_path / "w.duckdb"
    first = fares([1], pa.int32())
    asset = batch_asset(two_days(first, with_tip(fares([2**40], pa.int64()))))
    run([asset], db, DAY_1)

    with pytest.raises(ia.SchemaMismatchError) as refused:
        run([asset], db, DAY_2)

    assert (
        "or let every publish make such changes itself, in its own transaction:"
        " metadata={'schema_evolution': 'add_columns_and_widen_types'}; or, for an intended"
        " schema change, migrate the table first, then rerun: ALTER TABLE main.trips ADD COLUMN"
        " tip DOUBLE; ALTER TABLE main.trips ALTER COLUMN fare TYPE BIGINT."
    ) in str(refused.value)


def test_an_unknown_evolution_names_the_allowed_values(tmp_path: Path) -> None:
    asset = batch_asset(fares([1], pa.int32()), metadata=evolving("add"))

    with pytest.raises(ia.ConfigurationError) as refused:
        run([asset], tmp_path / "w.duckdb", DAY_1)

    assert str(refused.value) == (
        "Asset 'trips': metadata 'schema_evolution' must be one of 'strict', 'add_columns',"
        " 'widen_types', 'add_columns_and_widen_types', got 'add'. Fix:"
        " metadata={'schema_evolution': 'add_columns'} to let a publish add the batch's new"
        " columns, or leave it out to refuse every schema change."
    )


@pytest.mark.parametrize("table_aware", [False, True], ids=["naive-table", "aware-table"])
def test_the_printed_time_zone_migration_keeps_every_instant_in_any_session(
    tmp_path: Path, table_aware: bool
) -> None:
    """DuckDB reads a bare TYPE change in the session's zone: the printed one names UTC."""
    db = tmp_path / "w.duckdb"
    zone = "UTC" if table_aware else None

    def trip(trip_id: int, day: str, tz: str | None) -> pa.Table:
        start = datetime.fromisoformat(day).replace(hour=23, minute=30)
        return pa.table(
            {"trip_id": [trip_id], "pickup_at": pa.array([start], pa.timestamp("us", tz=tz))}
        )

    write = settings("overwrite", OVERWRITE_MD)
    with duckdb.connect(str(db)) as conn:
        ia.publish(conn, trip(1, DAY_1, zone), write, window(DAY_1), now=NOW)
        aware = trip(2, DAY_2, None if table_aware else "UTC")
        with pytest.raises(ia.SchemaMismatchError) as refused:
            ia.publish(conn, aware, write, window(DAY_2), now=NOW)
        statement = str(refused.value).split("then rerun: ", 1)[1].split(". A TIMESTAMP", 1)[0]
        assert statement.endswith("USING pickup_at AT TIME ZONE 'UTC'")
        conn.execute("SET TimeZone = 'America/New_York'")
        conn.execute(statement)
        conn.execute("SET TimeZone = 'UTC'")
        ia.publish(conn, aware, write, window(DAY_2), now=NOW)
        stored = conn.execute(
            "SELECT trip_id, strftime(pickup_at, '%Y-%m-%d %H:%M') FROM main.trips ORDER BY 1"
        ).fetchall()
    assert stored == [(1, f"{DAY_1} 23:30"), (2, f"{DAY_2} 23:30")]
