"""Static, dynamic and multi-dimensional partitions on Delta: literals, layout and pruning."""

from pathlib import Path
from typing import Any

import dagster as dg
import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import idem_assets as ia
from idem_assets.lib.backends.delta.backend import DeltaBackend
from idem_assets.lib.backends.delta.layout import DAY_COLUMN
from tests.conformance.test_partition_kinds import (
    BY_DAY_AND_REGION,
    DAYS,
    MULTI,
    ONE_DIM,
    REGIONS,
    ROWS,
    STATIC,
    rows_of,
    sales,
)
from tests.delta.test_delta_backend import race, run_handover
from tests.helpers import NOW, settings

#: Keys that would end a literal quoted naively, or read as an escape.
AWKWARD = ["o'brien", "x') OR true OR ('y", "back\\", "plain"]


def publish(
    root: str,
    batch: pa.Table,
    partitions_def: dg.PartitionsDefinition,
    metadata: dict[str, Any],
    *keys: str,
    mode: str = "overwrite",
) -> ia.PublishResult:
    write = settings(mode, metadata, table="sales", partitions_def=partitions_def)
    window = ia.window_from_keys(partitions_def, list(keys), "sales")
    with DeltaBackend(root) as backend:
        return ia.publish(backend, batch, write, window, now=NOW)


def stored(root: str) -> list[tuple]:
    found = DeltaTable(f"{root}/main/sales").to_pyarrow_table()
    found = found.drop_columns([DAY_COLUMN]) if DAY_COLUMN in found.column_names else found
    return sorted(zip(*found.to_pydict().values(), strict=True))


def of_region(batch: pa.Table, region: str) -> pa.Table:
    """``batch`` moved to ``region``."""
    return batch.set_column(2, "region", pa.array([region] * batch.num_rows, pa.string()))


def awkward_rows(key: str, version: int = 0) -> pa.Table:
    """``sales`` of the awkward region ``key``, ids unique to it."""
    batch = sales(DAYS[0], "east", version)
    ids = pa.array([i + 1_000 * AWKWARD.index(key) for i in batch.column("sale_id").to_pylist()])
    batch = batch.set_column(0, "sale_id", ids)
    return of_region(batch, key)


def files_by_partition(root: str) -> dict[tuple[tuple[str, Any], ...], set[str]]:
    """Each Delta partition of the table with its files."""
    actions = pa.table(DeltaTable(f"{root}/main/sales").get_add_actions(flatten=True))
    parts = [c for c in actions.column_names if c.startswith("partition.")]
    found: dict[tuple[tuple[str, Any], ...], set[str]] = {}
    for row in actions.to_pylist():
        found.setdefault(tuple((c, row[c]) for c in parts), set()).add(row["path"])
    return found


@pytest.mark.parametrize("mode", ["overwrite", "merge"])
def test_a_key_with_a_quote_is_a_value_and_never_sql(tmp_path: Path, mode: str) -> None:
    """A key holding ``'`` or ``\\`` scopes its own rows: the predicate cannot be broken out of."""
    root, awkward, breaker = str(tmp_path), dg.StaticPartitionsDefinition(AWKWARD), AWKWARD[1]
    for key in AWKWARD:
        publish(root, awkward_rows(key), awkward, ONE_DIM, key, mode=mode)
    newer = awkward_rows(breaker, version=4).slice(1)
    result = publish(root, newer, awkward, ONE_DIM, breaker, mode=mode)
    assert (result.rows, result.deleted) == (ROWS - 1, ROWS if mode == "overwrite" else 1)
    kept = [awkward_rows(k) for k in AWKWARD if k != breaker]
    assert stored(root) == rows_of(*kept, newer)
    with DeltaBackend(root) as backend:
        one = ia.window_from_keys(awkward, ["o'brien"], "sales")
        found = ia.table_fingerprint(backend, "main", "sales", "region", one)
    assert found is not None and found.startswith(f"{ROWS}:")


def test_each_category_has_its_own_files_and_a_rerun_touches_only_them(tmp_path: Path) -> None:
    root = str(tmp_path)
    for region in REGIONS:
        publish(root, sales(DAYS[0], region), STATIC, ONE_DIM, region)
    assert DeltaTable(f"{root}/main/sales").metadata().partition_columns == ["region"]
    before = files_by_partition(root)
    publish(root, sales(DAYS[0], "north", version=2), STATIC, ONE_DIM, "north")
    after = files_by_partition(root)
    north = (("partition.region", "north"),)
    assert set(after) == set(before) == {(("partition.region", r),) for r in REGIONS}
    assert {k: v for k, v in after.items() if k != north} == {
        k: v for k, v in before.items() if k != north
    }
    assert after[north].isdisjoint(before[north])

    # Another category's files gone: a load of this one never opens them.
    for path in after[(("partition.region", "east"),)]:
        (tmp_path / "main" / "sales" / path).unlink()
    write = settings("overwrite", ONE_DIM, table="sales", partitions_def=STATIC)
    with DeltaBackend(root) as backend:
        window = ia.window_from_keys(STATIC, ["south"], "sales")
        loaded = backend.load(write, window, nothing=False, arrow=True)
    assert rows_of(loaded) == rows_of(sales(DAYS[0], "south"))


def test_a_multi_partitioned_table_is_partitioned_by_day_then_category(tmp_path: Path) -> None:
    root = str(tmp_path)
    for day in DAYS[:2]:
        for region in ("north", "south"):
            publish(root, sales(day, region), MULTI, BY_DAY_AND_REGION, f"{day}|{region}")
    table = DeltaTable(f"{root}/main/sales")
    assert table.metadata().partition_columns == [DAY_COLUMN, "region"]
    cells = {(p[DAY_COLUMN], p["region"]) for p in table.partitions()}
    assert cells == {(d, r) for d in DAYS[:2] for r in ("north", "south")}


@pytest.mark.parametrize("mode", ["overwrite", "merge"])
def test_a_table_of_another_writer_without_partitions_is_scoped_by_its_rows(
    tmp_path: Path, mode: str
) -> None:
    """No partition values to prune by: the predicate and a scan still find exactly the key."""
    root = str(tmp_path)
    every = pa.concat_tables([sales(DAYS[0], r) for r in REGIONS])
    # One file holds every region: its statistics cannot tell the regions apart.
    write_deltalake(f"{root}/main/sales", every)
    with pytest.raises(ia.ConfigurationError, match="no asset owns it") as refused:
        publish(root, sales(DAYS[0], "north"), STATIC, ONE_DIM, "north", mode=mode)
    run_handover(str(refused.value))
    newer = sales(DAYS[0], "north", version=6).slice(2)
    result = publish(root, newer, STATIC, ONE_DIM, "north", mode=mode)
    assert result.rows == ROWS - 2
    assert result.deleted == (ROWS if mode == "overwrite" else 2)
    assert stored(root) == rows_of(sales(DAYS[0], "east"), newer, sales(DAYS[0], "south"))
    assert DeltaTable(f"{root}/main/sales").metadata().partition_columns == []


def test_writers_of_different_categories_both_commit(tmp_path: Path) -> None:
    """Two writers of different keys, deciding on one version, both commit without a retry."""
    root = str(tmp_path)
    publish(root, sales(DAYS[0], "east"), STATIC, ONE_DIM, "east")
    found = race(root, tmp_path / "barrier", [("north", 1), ("south", 2)])
    assert [(f["outcome"], f["attempts"]) for f in found] == [("committed", 1)] * 2, found
    assert stored(root) == rows_of(
        sales(DAYS[0], "east"), sales(DAYS[0], "north", 1), sales(DAYS[0], "south", 2)
    )


def test_writers_of_one_category_leave_exactly_one_batch(tmp_path: Path) -> None:
    root = str(tmp_path)
    for region in REGIONS:
        publish(root, sales(DAYS[0], region), STATIC, ONE_DIM, region)
    found = race(root, tmp_path / "barrier", [("north", 1), ("north", 2)])
    assert all(f["outcome"] == "committed" for f in found), found
    # Both decided on one version: the second commit conflicted and started over on the first's.
    assert sorted(f["attempts"] for f in found) == [1, 2]
    north = [r for r in stored(root) if r[2] == "north"]
    assert north in (rows_of(sales(DAYS[0], "north", 1)), rows_of(sales(DAYS[0], "north", 2)))
    assert len(stored(root)) == 3 * ROWS


def test_an_empty_key_of_a_partition_column_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    """Delta stores '' in a partition column as NULL: the rows would leave their partition."""
    root, blank = str(tmp_path), dg.StaticPartitionsDefinition(["", "east"])
    publish(root, sales(DAYS[0], "east"), blank, ONE_DIM, "east")
    version = DeltaTable(f"{root}/main/sales").version()
    with pytest.raises(ia.ConfigurationError, match="is the empty string, which Delta Lake"):
        publish(root, of_region(sales(DAYS[0], "east"), ""), blank, ONE_DIM, "")
    assert DeltaTable(f"{root}/main/sales").version() == version
    assert stored(root) == rows_of(sales(DAYS[0], "east"))


@pytest.mark.parametrize(
    ("key", "refusal"),
    [
        ("__HIVE_DEFAULT_PARTITION__", "the name Hive-style partition paths give NULL"),
        ("x" * 249, "would name a directory of 256 bytes"),
        # 50 characters, 300 bytes once written: each byte of UTF-8 takes three.
        ("é" * 50, "would name a directory of 307 bytes"),
    ],
    ids=["hive-null", "too-long", "too-long-once-encoded"],
)
def test_a_key_a_path_cannot_hold_is_refused_and_writes_nothing(
    tmp_path: Path, key: str, refusal: str
) -> None:
    """The directory region=<key> reads back as NULL in Polars, or exceeds a file name."""
    root, keys = str(tmp_path), dg.StaticPartitionsDefinition([key, "east", "x" * 248])
    publish(root, sales(DAYS[0], "east"), keys, ONE_DIM, "east")
    version = DeltaTable(f"{root}/main/sales").version()
    with pytest.raises(ia.ConfigurationError, match=refusal):
        publish(root, of_region(sales(DAYS[0], "east"), key), keys, ONE_DIM, key)
    assert DeltaTable(f"{root}/main/sales").version() == version
    assert stored(root) == rows_of(sales(DAYS[0], "east"))
    # The longest key a file name takes is stored, and read back as itself by Polars too.
    longest = of_region(sales(DAYS[0], "north"), "x" * 248)
    publish(root, longest, keys, ONE_DIM, "x" * 248)
    assert set(pl.read_delta(f"{root}/main/sales")["region"]) == {"east", "x" * 248}
