"""partition_expr as an SQL expression over the batch's columns, as dagster-duckdb takes it.

An engine that evaluates expressions (DuckDB, PostgreSQL: ``Capabilities.expression_dialect``)
replaces the window the expression places rows in, on every rerun, and the guards refuse rows it
places elsewhere or nowhere; an engine that scopes writes by a stored column (Delta Lake,
Iceberg, Spark) refuses the expression before writing anything, with a migration that works.
"""

import re
from typing import Any

import dagster as dg
import pyarrow as pa
import pytest

import idem_assets as ia
from tests.conformance.conftest import Store
from tests.helpers import DAILY

TEXT_DAY: dict[str, Any] = {"partition_expr": "CAST(time AS DATE)"}
COLORS = dg.StaticPartitionsDefinition(["red", "blue"])
DAY_AND_COLOR = dg.MultiPartitionsDefinition({"time": DAILY, "color": COLORS})
#: The same parse of a text day, as each engine spells it (dagster-duckdb's own test's strptime).
PARSED_DAY = {
    "duckdb": "strptime(key, '%Y-%m-%d')",
    "postgres": "to_timestamp(key, 'YYYY-MM-DD')",
}


def rows(
    day: str, version: int = 0, color: str = "red", times: list[str] | None = None
) -> pa.Table:
    """Three rows whose 'time' is their day as text; ids unique per day and color."""
    base = int(day.replace("-", "")) * 10 + ["red", "blue"].index(color) * 5
    days = times or [day] * 3
    return pa.table(
        {
            "time": pa.array(days, pa.string()),
            "color": pa.array([color] * len(days), pa.string()),
            "event_id": pa.array([base + i for i in range(len(days))], pa.int64()),
            "amount": pa.array([float(i + version) for i in range(len(days))]),
        }
    )


def stored(day: str, version: int = 0, color: str = "red") -> list[tuple]:
    """What ``rows(day, version, color)`` reads back as, sorted."""
    return sorted(zip(*rows(day, version, color).to_pydict().values(), strict=True))


def events(
    metadata: dict[str, Any],
    partitions_def: dg.PartitionsDefinition = DAILY,
    batch: pa.Table | None = None,
    version: int = 0,
    fix: str = "",
    io_manager: str = "io_manager",
) -> dg.AssetsDefinition:
    """An asset returning its partition's rows (or ``batch``), after running ``fix`` on them."""

    @dg.asset(
        name="events", partitions_def=partitions_def, metadata=metadata, io_manager_key=io_manager
    )
    def compute(context: dg.AssetExecutionContext) -> pa.Table:
        key = context.partition_key
        if isinstance(key, dg.MultiPartitionKey):
            by_dim = key.keys_by_dimension
            table = rows(by_dim["time"], version, by_dim["color"])
        else:
            table = rows(key, version)
        table = batch if batch is not None else table
        if not fix:
            return table
        # The refusal's printed migration, run as printed.
        df = table.to_pandas()
        exec(fix, {"pd": __import__("pandas"), "df": df})
        return pa.Table.from_pandas(df, preserve_index=False)

    return compute


def expressive(store: Store) -> bool:
    """Whether the store's engine evaluates partition expressions (its declared capability)."""
    with store.open() as backend:
        return backend.capabilities.expression_dialect is not None


def run(store: Store, asset: dg.AssetsDefinition, key: str | dg.MultiPartitionKey) -> None:
    """One run of one partition, which must succeed."""
    assert dg.materialize([asset], partition_key=key, resources=store.resources()).success


def refused(
    store: Store, asset: dg.AssetsDefinition, key: str | dg.MultiPartitionKey, error: type
) -> str:
    """The message a run is refused with; the store is left as it was."""
    before = store.snapshot()
    with pytest.raises(error) as raised:
        dg.materialize([asset], partition_key=key, resources=store.resources())
    assert store.snapshot() == before
    return str(raised.value)


def test_a_text_day_cast_to_date_replaces_its_partition_on_every_rerun(store: Store) -> None:
    """dagster-duckdb's CAST(time AS DATE) over a text column: reruns replace, never add.

    An engine that cannot evaluate it refuses it, writing nothing, and the migration it prints
    (the column to compute, the metadata naming it) then replaces as a column does.
    """
    if not expressive(store):
        message = refused(store, events(TEXT_DAY), "2026-01-01", ia.ConfigurationError)
        assert "is the SQL expression 'CAST(\"time\" AS DATE)'" in message
        assert "Nothing was changed. Fix: compute the column in the asset, " in message
        fix = re.search(r"(df\[.*?\] = .*?) \(pandas", message)
        metadata = re.search(r"metadata=(\{.*?\})", message)
        assert fix is not None and metadata is not None
        assert metadata.group(1) == "{'partition_expr': 'time_date'}"
        migrated = events({"partition_expr": "time_date"}, fix=fix.group(1))
        for key in ["2026-01-01", "2026-01-02", "2026-01-01"]:
            run(store, migrated, key)
        assert sorted(r[:4] for r in store.rows("events")) == stored("2026-01-01") + stored(
            "2026-01-02"
        )
        return
    run(store, events(TEXT_DAY), "2026-01-01")
    run(store, events(TEXT_DAY), "2026-01-02")
    assert store.rows("events") == stored("2026-01-01") + stored("2026-01-02")
    run(store, events(TEXT_DAY, version=1), "2026-01-01")
    run(store, events(TEXT_DAY, version=1), "2026-01-01")
    assert store.rows("events") == stored("2026-01-01", 1) + stored("2026-01-02")


def test_a_dict_of_an_expression_and_a_column_scopes_each_cell(store: Store) -> None:
    """The multi-partition form dagster-duckdb takes: {'time': 'CAST(...)', 'color': 'color'}."""
    metadata = {"partition_expr": {"time": "CAST(time AS DATE)", "color": "color"}}
    cell = dg.MultiPartitionKey({"time": "2026-01-01", "color": "red"})
    if not expressive(store):
        message = refused(store, events(metadata, DAY_AND_COLOR), cell, ia.ConfigurationError)
        assert "that dimension's entry" in message
        return
    cells = [("2026-01-01", "red"), ("2026-01-01", "blue"), ("2026-01-02", "red")]
    for day, color in cells:
        run(
            store,
            events(metadata, DAY_AND_COLOR),
            dg.MultiPartitionKey({"time": day, "color": color}),
        )
    run(store, events(metadata, DAY_AND_COLOR, version=1), cell)
    run(store, events(metadata, DAY_AND_COLOR, version=1), cell)
    assert store.rows("events") == sorted(
        stored("2026-01-01", 1, "red") + stored("2026-01-01", 0, "blue") + stored("2026-01-02")
    )


@pytest.mark.parametrize("store", sorted(PARSED_DAY), indirect=True)
def test_a_row_the_expression_places_in_another_day_is_refused(store: Store) -> None:
    """A stray row is judged by the expression's value: refused, with a sample, nothing changed."""
    assert expressive(store)
    run(store, events(TEXT_DAY), "2026-01-01")
    stray = rows("2026-01-01", 1, times=["2026-01-01", "2026-01-02", "2026-01-01"])
    message = refused(store, events(TEXT_DAY, batch=stray), "2026-01-01", ia.StrayRowsError)
    assert "1 of 3 rows have 'CAST(\"time\" AS DATE)' outside the window" in message
    assert "time='2026-01-02'" in message
    assert store.rows("events") == stored("2026-01-01")


@pytest.mark.parametrize("store", sorted(PARSED_DAY), indirect=True)
def test_a_value_the_expression_cannot_convert_belongs_to_no_partition(store: Store) -> None:
    """Text that is no date is refused as a row of no partition, with the row as a sample."""
    assert expressive(store)
    bad = rows("2026-01-01", times=["2026-01-01", "not a day", None])  # type: ignore[list-item]
    message = refused(store, events(TEXT_DAY, batch=bad), "2026-01-01", ia.NullValueError)
    assert '2 of 3 rows have no value for partition_expr CAST("time" AS DATE)' in message
    assert "time='not a day'" in message


@pytest.mark.parametrize("store", sorted(PARSED_DAY), indirect=True)
def test_an_asset_reading_its_previous_day_through_a_parsed_text_day(store: Store) -> None:
    """dagster-duckdb's self-dependent asset: loads and writes go through the same expression."""
    assert expressive(store)
    expression = PARSED_DAY[store.name]
    seen: list[list[str]] = []

    @dg.asset(
        partitions_def=DAILY,
        metadata={"partition_expr": expression},
        ins={
            "history": dg.AssetIn(
                key=dg.AssetKey(["history"]),
                partition_mapping=dg.TimeWindowPartitionMapping(start_offset=-1, end_offset=-1),
            )
        },
    )
    def history(context: dg.AssetExecutionContext, history: pa.Table) -> pa.Table:
        seen.append(history.column("key").to_pylist() if history.num_rows else [])
        day = context.partition_key
        return pa.table({"key": [day] * 3, "a": [len(seen)] * 3})

    for day in ["2026-01-01", "2026-01-02", "2026-01-02"]:
        assert dg.materialize([history], partition_key=day, resources=store.resources()).success
    assert seen == [[], ["2026-01-01"] * 3, ["2026-01-01"] * 3]
    assert store.rows("history") == [("2026-01-01", 1)] * 3 + [("2026-01-02", 3)] * 3


@pytest.mark.parametrize("store", sorted(PARSED_DAY), indirect=True)
def test_a_merge_by_an_expression_upserts_its_window_and_refuses_a_key_of_another_day(
    store: Store,
) -> None:
    """The merge's counts, deletes and key lookups place rows by the expression too."""
    assert expressive(store)
    metadata = {**TEXT_DAY, "primary_key": ["event_id"]}

    def merged(batch: pa.Table | None = None, version: int = 0) -> dg.AssetsDefinition:
        return events(metadata, batch=batch, version=version, io_manager="merge_io_manager")

    run(store, merged(), "2026-01-01")
    run(store, merged(), "2026-01-02")
    two = rows("2026-01-01", 1).slice(0, 2)
    run(store, merged(two), "2026-01-01")
    run(store, merged(two), "2026-01-01")
    assert store.rows("events") == sorted(stored("2026-01-01", 1)[:2] + stored("2026-01-02"))
    # Day 2's first key, sent again as a row of day 1.
    moved = rows("2026-01-01", times=["2026-01-01"]).set_column(
        2, "event_id", pa.array([202601020], pa.int64())
    )
    message = refused(store, merged(moved), "2026-01-01", ia.KeyOutsideWindowError)
    assert "1 key(s) of the batch already exist in other partitions" in message
