"""Merge semantics: the Databricks upsert case, batch deduplication and window-scoped deletes."""

import random
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

import idem_assets as ia

from .support import (
    DAILY,
    DAYS,
    count,
    fingerprint,
    frame_rows,
    output_metadata,
    partition_fingerprints,
    publish,
    read,
    rows,
    run,
    settings,
    trips,
    trips_asset,
)

TARGET = pd.DataFrame(
    {"id": [1, 2, 3], "name": ["ann", "bob", "cy"], "salary": [70000, 88000, 61000]}
)
SOURCE = pd.DataFrame({"id": [2, 4], "name": ["bob", "dee"], "salary": [95000, 52000]})
MERGED = [(1, "ann", 70000), (2, "bob", 95000), (3, "cy", 61000), (4, "dee", 52000)]


class FakeSource:
    """The upstream system: whatever batch the test puts here is what the asset returns."""

    def __init__(self, batch: pd.DataFrame) -> None:
        self.batch = batch

    def __call__(self, context: dg.AssetExecutionContext | None = None) -> pd.DataFrame:
        return self.batch.copy()


def employees_asset(source: FakeSource, metadata: dict[str, Any]) -> dg.AssetsDefinition:
    @dg.asset(io_manager_key="merge_io_manager", metadata=metadata)
    def employees() -> pd.DataFrame:
        """Employees, upserted on id."""
        return source()

    return employees


def test_databricks_merge_updates_id_2_inserts_id_4_and_reruns_identically(
    tmp_path: Path,
) -> None:
    db = tmp_path / "warehouse.duckdb"
    source = FakeSource(TARGET)
    asset = employees_asset(source, {"primary_key": ["id"], "delete_missing": False})
    run([asset], db)

    source.batch = SOURCE
    first = output_metadata(run([asset], db))[None]
    with read(db) as conn:
        assert rows(conn, "employees") == MERGED
        after_first = fingerprint(conn, "employees")
    second = output_metadata(run([asset], db))[None]

    with read(db) as conn:
        assert rows(conn, "employees") == MERGED
        assert fingerprint(conn, "employees") == after_first
    assert (first["rows_updated"], first["rows_inserted"], first["rows_deleted"]) == (1, 1, 0)
    assert (second["rows_updated"], second["rows_inserted"], second["rows_deleted"]) == (2, 0, 0)
    assert first["dagster/row_count"] == second["dagster/row_count"] == 4
    assert "partitions_written" not in first


def test_unpartitioned_merge_with_delete_missing_replaces_the_whole_table(tmp_path: Path) -> None:
    db = tmp_path / "warehouse.duckdb"
    source = FakeSource(TARGET)
    asset = employees_asset(source, {"primary_key": ["id"]})
    run([asset], db)
    source.batch = SOURCE
    md = output_metadata(run([asset], db))[None]

    with read(db) as conn:
        assert rows(conn, "employees") == [(2, "bob", 95000), (4, "dee", 52000)]
    assert (md["rows_updated"], md["rows_inserted"], md["rows_deleted"]) == (1, 1, 2)


def test_databricks_merge_partitioned_variant(tmp_path: Path) -> None:
    db = tmp_path / "warehouse.duckdb"
    hired, other_day = date(2026, 1, 2), date(2026, 1, 1)
    eve = pd.DataFrame({"id": [9], "name": ["eve"], "salary": [1], "hired_on": [other_day]})
    source = {"2026-01-01": eve, "2026-01-02": TARGET.assign(hired_on=hired)}

    @dg.asset(
        partitions_def=DAILY,
        io_manager_key="merge_io_manager",
        metadata={"partition_expr": "hired_on", "primary_key": ["id"], "delete_missing": False},
    )
    def employees(context: dg.AssetExecutionContext) -> pd.DataFrame:
        """Employees by hire day, upserted on id."""
        return source[context.partition_key]

    run([employees], db, "2026-01-01")
    run([employees], db, "2026-01-02")
    source["2026-01-02"] = SOURCE.assign(hired_on=hired)
    first = output_metadata(run([employees], db, "2026-01-02"))["2026-01-02"]
    with read(db) as conn:
        after_first = fingerprint(conn, "employees")
    run([employees], db, "2026-01-02")

    with read(db) as conn:
        assert rows(conn, "employees") == sorted(
            [(*row, hired) for row in MERGED] + [(9, "eve", 1, other_day)]
        )
        assert fingerprint(conn, "employees") == after_first
    assert (first["rows_updated"], first["rows_inserted"], first["rows_deleted"]) == (1, 1, 0)
    assert first["dagster/row_count"] == 4


# Duplicates inside the batch --------------------------------------------------------------------

UPDATED = datetime(2026, 1, 2, 9, 0)


def batch_with_id_4_twice(*, tie: bool = False) -> pd.DataFrame:
    """Id 4 sent twice; the second copy is later (or, with ``tie``, equally late)."""
    later = UPDATED if tie else UPDATED + timedelta(hours=1)
    # The copies differ in name and salary in opposite directions, so an exact tie is decided
    # by a fixed column order (name before salary), not by the batch's column order.
    return pd.DataFrame(
        {
            "id": [2, 4, 4],
            "name": ["bob", "dee", "dea"],
            "salary": [95000, 52000, 53000],
            "updated_at": [UPDATED, UPDATED, later],
        }
    )


def test_a_batch_holding_id_4_twice_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "warehouse.duckdb"
    source = FakeSource(TARGET.assign(updated_at=UPDATED - timedelta(days=1)))
    asset = employees_asset(source, {"primary_key": ["id"], "delete_missing": False})
    run([asset], db)
    with read(db) as conn:
        before = fingerprint(conn, "employees")

    source.batch = batch_with_id_4_twice()
    with pytest.raises(ia.DuplicateKeyError, match=r"'dedupe_order_by': \['updated_at'\]"):
        run([asset], db)

    with read(db) as conn:
        assert fingerprint(conn, "employees") == before
        assert count(conn, "employees") == 3


@pytest.mark.parametrize("tie", [False, True], ids=["latest-wins", "exact-tie"])
def test_dedupe_order_by_keeps_the_latest_version_whatever_the_row_order(
    tmp_path: Path, tie: bool
) -> None:
    metadata = {"primary_key": ["id"], "dedupe_order_by": ["updated_at"], "delete_missing": False}
    target = TARGET.assign(updated_at=UPDATED - timedelta(days=1))
    batch = batch_with_id_4_twice(tie=tie)
    results = set()
    for seed in range(6):
        shuffled = batch.sample(frac=1, random_state=seed).reset_index(drop=True)
        if seed % 2:
            shuffled = shuffled[list(reversed(shuffled.columns))]  # column order must not matter
        with duckdb.connect(str(tmp_path / f"dedupe_{seed}.duckdb")) as conn:
            s = settings("merge", metadata, table="employees", partitioned=False)
            publish(conn, target, s, None)
            result = publish(conn, shuffled, s, None)
            assert (result.updated, result.inserted, result.rows) == (1, 1, 4)
            results.add((tuple(rows(conn, "employees")), fingerprint(conn, "employees")))

    assert len(results) == 1
    ((table, _),) = results
    id_4 = [row for row in table if row[0] == 4]
    # The later updated_at wins; on an exact tie the remaining columns decide, in name order,
    # smallest first: "dea" < "dee" although 53000 > 52000.
    assert id_4 == [(4, "dea", 53000, UPDATED + timedelta(hours=0 if tie else 1))]
    assert len(table) == 4


def test_dedupe_through_the_io_manager(tmp_path: Path) -> None:
    db = tmp_path / "warehouse.duckdb"
    source = FakeSource(TARGET.assign(updated_at=UPDATED - timedelta(days=1)))
    metadata = {"primary_key": ["id"], "dedupe_order_by": ["updated_at"], "delete_missing": False}
    asset = employees_asset(source, metadata)
    run([asset], db)
    source.batch = batch_with_id_4_twice()
    md = output_metadata(run([asset], db))[None]

    with read(db) as conn:
        assert [r[:3] for r in rows(conn, "employees")] == [
            (1, "ann", 70000),
            (2, "bob", 95000),
            (3, "cy", 61000),
            (4, "dea", 53000),
        ]
    assert (md["rows_updated"], md["rows_inserted"]) == (1, 1)


# Window-scoped merge -----------------------------------------------------------------------------


def corrected_day(day: str) -> pd.DataFrame:
    """The day re-sent after a fix: 10 fares corrected, 5 trips removed."""
    batch = trips(day)
    batch.loc[:9, "fare"] = batch.loc[:9, "fare"] + 100
    return batch.drop(index=range(500, 505)).reset_index(drop=True)


@pytest.mark.parametrize("delete_missing", [True, False])
def test_a_corrected_batch_updates_and_deletes_inside_its_window_only(
    tmp_path: Path, delete_missing: bool
) -> None:
    db = tmp_path / "warehouse.duckdb"
    source: dict[str, pd.DataFrame] = {}

    def batch_for(context: dg.AssetExecutionContext) -> pd.DataFrame:
        return source.get(context.partition_key, trips(context.partition_key))

    metadata = {"partition_expr": "pickup_at", "primary_key": ["trip_id"]}
    if not delete_missing:
        metadata["delete_missing"] = False
    asset = trips_asset("merge_io_manager", metadata, batch_for)
    for day in DAYS:
        run([asset], db, day)
    with read(db) as conn:
        before = partition_fingerprints(conn)

    source["2026-01-02"] = corrected_day("2026-01-02")
    md = output_metadata(run([asset], db, "2026-01-02"))["2026-01-02"]

    with read(db) as conn:
        after = partition_fingerprints(conn)
        assert [after[0], after[2]] == [before[0], before[2]]  # other days untouched
        assert after[1] != before[1]
        day_rows = rows(conn, where="pickup_at >= '2026-01-02' AND pickup_at < '2026-01-03'")
        corrected = frame_rows(corrected_day("2026-01-02"))
        if delete_missing:
            assert day_rows == corrected
        else:
            removed = frame_rows(trips("2026-01-02").iloc[500:505])
            assert day_rows == sorted(corrected + removed)
    assert md["rows_updated"] == 995
    assert md["rows_inserted"] == 0
    assert md["rows_deleted"] == (5 if delete_missing else 0)
    assert md["dagster/row_count"] == (995 if delete_missing else 1000)


# The implementation equals DuckDB's own MERGE ----------------------------------------------------

SCHEMA = pa.schema([("id", pa.int64()), ("pickup_at", pa.timestamp("us")), ("v", pa.int64())])
BASE = datetime(2026, 1, 1)


def _moment(day: int, minute: int) -> datetime:
    return BASE + timedelta(days=day, minutes=minute)


@st.composite
def merge_cases(draw: st.DrawFn) -> tuple[list[tuple], list[tuple], list[str], bool]:
    """A target over three days, a window of one or two days and a clean batch for it."""
    ids = draw(st.lists(st.integers(0, 40), unique=True, min_size=3, max_size=25))
    target = [
        (i, _moment(draw(st.integers(0, 2)), draw(st.integers(0, 1439))), draw(st.integers(0, 9)))
        for i in ids
    ]
    first = draw(st.integers(0, 2))
    last = draw(st.integers(first, min(first + 1, 2)))
    days = list(range(first, last + 1))
    in_window = [row[0] for row in target if (row[1] - BASE).days in days]
    kept = draw(st.lists(st.booleans(), min_size=len(in_window), max_size=len(in_window)))
    matched = [i for i, keep in zip(in_window, kept, strict=True) if keep]
    new = draw(st.lists(st.integers(100, 140), unique=True, max_size=10))
    batch = [
        (
            i,
            _moment(draw(st.sampled_from(days)), draw(st.integers(0, 1439))),
            draw(st.integers(0, 9)),
        )
        for i in matched + new
    ]
    keys = [DAYS[d] for d in days]
    return target, batch, keys, draw(st.booleans())


def _table(conn: duckdb.DuckDBPyConnection, name: str, data: list[tuple]) -> None:
    conn.execute(f"CREATE TABLE {name} (id BIGINT, pickup_at TIMESTAMP, v BIGINT)")
    if data:
        conn.executemany(f"INSERT INTO {name} VALUES (?, ?, ?)", data)


@hypothesis_settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(merge_cases())
def test_merge_equals_duckdb_merge_into_with_a_window_scoped_delete(
    case: tuple[list[tuple], list[tuple], list[str], bool],
) -> None:
    target, batch, keys, delete_missing = case
    metadata = {
        "partition_expr": "pickup_at",
        "primary_key": ["id"],
        "delete_missing": delete_missing,
        "allow_empty": True,
    }
    random.Random(len(batch)).shuffle(batch)
    arrow = pa.Table.from_pylist([dict(zip(SCHEMA.names, r, strict=True)) for r in batch], SCHEMA)

    with duckdb.connect() as ours, duckdb.connect() as reference:
        _table(ours, "t", target)
        publish(ours, arrow, settings("merge", metadata, table="t"), keys)

        _table(reference, "t", target)
        _table(reference, "s", batch)
        start = datetime.fromisoformat(keys[0])
        end = datetime.fromisoformat(keys[-1]) + timedelta(days=1)
        delete = (
            " WHEN NOT MATCHED BY SOURCE AND t.pickup_at >= ? AND t.pickup_at < ? THEN DELETE"
            if delete_missing
            else ""
        )
        reference.execute(
            "MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN UPDATE SET *"
            " WHEN NOT MATCHED THEN INSERT *" + delete,
            [start, end] if delete_missing else [],
        )

        assert rows(ours, "t") == rows(reference, "t")


def test_a_composite_key_merges_on_every_key_column(tmp_path: Path) -> None:
    metadata = {"partition_expr": "pickup_at", "primary_key": ["zone", "kind"]}
    write = settings("merge", {**metadata, "delete_missing": False}, table="zones")
    day = pd.Timestamp("2026-01-02")
    target = pd.DataFrame(
        {"zone": [1, 1, 2], "kind": ["a", "b", "a"], "pickup_at": [day] * 3, "v": [1, 2, 3]}
    )
    batch = pd.DataFrame(
        {"zone": [1, 3], "kind": ["b", "a"], "pickup_at": [day] * 2, "v": [20, 30]}
    )
    with duckdb.connect(str(tmp_path / "w.duckdb")) as conn:
        publish(conn, target, write, ["2026-01-02"])
        result = publish(conn, batch, write, ["2026-01-02"])

        assert (result.updated, result.inserted, result.rows) == (1, 1, 4)
        assert [(r[0], r[1], r[3]) for r in rows(conn, "zones")] == [
            (1, "a", 1),
            (1, "b", 20),
            (2, "a", 3),
            (3, "a", 30),
        ]
        with pytest.raises(ia.DuplicateKeyError, match=r"\['zone', 'kind'\]"):
            publish(conn, pd.concat([batch, batch.iloc[[0]]]), write, ["2026-01-02"])
