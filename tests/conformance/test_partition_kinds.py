"""Static, dynamic and multi-dimensional partitions: the replace contract for every kind.

A run's window is exactly its keys: time spans times category values. Every backend must
replace those partitions and nothing else, keep a rerun equal to one run, and refuse a row of
another day or category, an emptied partition and a key living elsewhere, changing nothing.
"""

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import idem_assets as ia
from tests.conformance.conftest import Store
from tests.helpers import NOW, range_tags, settings

REGIONS = ["east", "north", "south"]
DAYS = ["2026-01-01", "2026-01-02", "2026-01-03"]
ROWS = 40
STATIC = dg.StaticPartitionsDefinition(REGIONS)
DYNAMIC = dg.DynamicPartitionsDefinition(name="stores")
DAILY = dg.DailyPartitionsDefinition(start_date="2026-01-01")
#: Dimensions are ordered by name in a key: "2026-01-02|north".
MULTI = dg.MultiPartitionsDefinition({"date": DAILY, "region": STATIC})
CHANNELS = dg.StaticPartitionsDefinition(["shop", "web"])
GRID = dg.MultiPartitionsDefinition({"channel": CHANNELS, "region": STATIC})

ONE_DIM: dict[str, Any] = {"partition_expr": "region", "primary_key": ["sale_id"]}
BY_DAY_AND_REGION: dict[str, Any] = {
    "partition_expr": {"date": "sold_at", "region": "region"},
    "primary_key": ["sale_id"],
}
BY_CHANNEL_AND_REGION: dict[str, Any] = {
    "partition_expr": {"channel": "channel", "region": "region"},
    "primary_key": ["sale_id"],
}

#: What a run's source returns: the rows of its keys, maybe altered.
Source = Callable[[dg.AssetExecutionContext], pa.Table]


def sales(day: str, region: str, version: int = 0, channel: str = "shop") -> pa.Table:
    """``ROWS`` sales of ``region`` on ``day``; ids unique across days, regions and channels."""
    start = datetime.fromisoformat(day)
    base = (
        int(start.strftime("%Y%m%d")) * 10_000
        + REGIONS.index(region) * 1_000
        + ["shop", "web"].index(channel) * 100
    )
    return pa.table(
        {
            "sale_id": pa.array([base + i for i in range(ROWS)], pa.int64()),
            "sold_at": pa.array(
                [start + timedelta(minutes=30 * i) for i in range(ROWS)], pa.timestamp("us")
            ),
            "region": pa.array([region] * ROWS, pa.string()),
            "channel": pa.array([channel] * ROWS, pa.string()),
            "amount": pa.array([float(i % 13 + version) for i in range(ROWS)]),
        }
    )


def dimensions(context: dg.AssetExecutionContext) -> list[dict[str, str]]:
    """Each key of the run as ``{dimension: value}`` (``""`` for a one-dimensional key)."""
    partitions_def = context.assets_def.partitions_def
    if isinstance(partitions_def, dg.MultiPartitionsDefinition):
        return [
            dict(partitions_def.get_partition_key_from_str(k).keys_by_dimension)
            for k in context.partition_keys
        ]
    return [{"": k} for k in context.partition_keys]


def run_rows(context: dg.AssetExecutionContext, version: int = 0) -> pa.Table:
    """The rows of every key of the run: the source of a well-behaved asset."""
    tables = []
    for dims in dimensions(context):
        region = dims.get("region", dims.get(""))
        tables.append(
            sales(dims.get("date", DAYS[0]), region, version, channel=dims.get("channel", "shop"))
        )
    return pa.concat_tables(tables)


def kind_asset(
    source: Source,
    partitions_def: dg.PartitionsDefinition,
    metadata: dict[str, Any],
    io_manager: str = "io_manager",
    name: str = "sales",
) -> dg.AssetsDefinition:
    """An asset of ``partitions_def`` whose batch is whatever ``source`` returns."""

    def compute(context: dg.AssetExecutionContext) -> pa.Table:
        return source(context)

    return dg.asset(
        name=name, partitions_def=partitions_def, io_manager_key=io_manager, metadata=metadata
    )(compute)


def run(
    store: Store,
    asset: dg.AssetsDefinition,
    key: str | None = None,
    *,
    first_last: tuple[str, str] | None = None,
    instance: dg.DagsterInstance | None = None,
) -> dg.ExecuteInProcessResult:
    """One run of ``asset`` for a key or a range of keys."""
    return dg.materialize(
        [asset],
        resources=store.resources(),
        partition_key=key,
        tags=range_tags(*first_last) if first_last else {},
        instance=instance,
    )


def rows_of(*tables: pa.Table) -> list[tuple]:
    """Rows as the store returns them: sorted tuples in column order."""
    table = pa.concat_tables(tables)
    return sorted(zip(*table.to_pydict().values(), strict=True))


def written_counts(result: dg.ExecuteInProcessResult) -> dict[str, int]:
    """Each partition's own row count, from its materialization."""
    return {
        str(e.materialization.partition): e.materialization.metadata["dagster/row_count"].value
        for e in result.get_asset_materialization_events()
    }


def refused(
    store: Store,
    asset: dg.AssetsDefinition,
    key: str,
    error: type[Exception],
    instance: dg.DagsterInstance | None = None,
) -> str:
    """Run ``asset`` for ``key``, expecting ``error`` and an unchanged store; the message."""
    before = store.snapshot()
    with pytest.raises(error) as caught:
        run(store, asset, key, instance=instance)
    assert store.snapshot() == before
    return str(caught.value)


def fill_static(store: Store, io_manager: str = "io_manager") -> None:
    for region in REGIONS:
        run(store, kind_asset(run_rows, STATIC, ONE_DIM, io_manager), region)


def fill_multi(store: Store, io_manager: str = "io_manager") -> None:
    cells = kind_asset(run_rows, MULTI, BY_DAY_AND_REGION, io_manager)
    for day in DAYS:
        for region in ("north", "south"):
            run(store, cells, f"{day}|{region}")


# Static partitions


@pytest.mark.parametrize("io_manager", ["io_manager", "merge_io_manager"])
def test_static_rerun_replaces_only_its_category(store: Store, io_manager: str) -> None:
    fill_static(store, io_manager)
    once = store.snapshot()
    fill_static(store, io_manager)
    assert store.snapshot() == once
    newer = kind_asset(lambda c: run_rows(c, version=7), STATIC, ONE_DIM, io_manager)
    run(store, newer, "north")
    d0 = DAYS[0]
    expected = rows_of(sales(d0, "east"), sales(d0, "north", 7), sales(d0, "south"))
    assert store.rows("sales") == expected


def test_static_range_in_one_run_equals_a_run_per_category(store: Store) -> None:
    result = run(store, kind_asset(run_rows, STATIC, ONE_DIM), first_last=("east", "north"))
    assert store.rows("sales") == rows_of(sales(DAYS[0], "east"), sales(DAYS[0], "north"))
    assert written_counts(result) == {"east": ROWS, "north": ROWS}


@pytest.mark.parametrize("io_manager", ["io_manager", "merge_io_manager"])
def test_static_row_of_another_category_is_refused(store: Store, io_manager: str) -> None:
    fill_static(store, io_manager)

    def with_stray(context: dg.AssetExecutionContext) -> pa.Table:
        return pa.concat_tables([run_rows(context), sales(DAYS[1], "south").slice(0, 1)])

    asset = kind_asset(with_stray, STATIC, ONE_DIM, io_manager)
    message = refused(store, asset, "north", ia.StrayRowsError)
    assert f"1 of {ROWS + 1} rows have 'region' outside the window" in message
    assert "'region' in ['north']" in message


@pytest.mark.parametrize("io_manager", ["io_manager", "merge_io_manager"])
def test_static_empty_batch_over_a_filled_category_is_refused(
    store: Store, io_manager: str
) -> None:
    fill_static(store, io_manager)
    empty = kind_asset(lambda c: run_rows(c).slice(0, 0), STATIC, ONE_DIM, io_manager)
    assert "would silently erase" in refused(store, empty, "south", ia.EmptyBatchError)


def test_static_merge_of_a_key_living_in_another_category_is_refused(store: Store) -> None:
    fill_static(store, "merge_io_manager")

    def moved(context: dg.AssetExecutionContext) -> pa.Table:
        south = sales(DAYS[0], "south").slice(0, 1)
        return pa.concat_tables(
            [run_rows(context), south.set_column(2, "region", pa.array(["north"]))]
        )

    asset = kind_asset(moved, STATIC, ONE_DIM, "merge_io_manager")
    assert "already exist in other partitions" in refused(
        store, asset, "north", ia.KeyOutsideWindowError
    )


def test_static_null_category_is_refused(store: Store) -> None:
    fill_static(store)

    def unplaced(context: dg.AssetExecutionContext) -> pa.Table:
        batch = run_rows(context)
        regions = [None, *batch.column("region").to_pylist()[1:]]
        return batch.set_column(2, "region", pa.array(regions, pa.string()))

    asset = kind_asset(unplaced, STATIC, ONE_DIM)
    assert "NULL in partition column 'region'" in refused(store, asset, "east", ia.NullValueError)


def test_an_integer_category_column_takes_integer_keys(store: Store) -> None:
    stores = dg.StaticPartitionsDefinition(["7", "12"])

    def by_store(context: dg.AssetExecutionContext) -> pa.Table:
        number = int(context.partition_key)
        return pa.table({"sale_id": [number * 10, number * 10 + 1], "store_id": [number, number]})

    metadata = {"partition_expr": "store_id", "primary_key": ["sale_id"]}
    for key in ["7", "12", "7"]:
        run(store, kind_asset(by_store, stores, metadata), key)
    assert store.rows("sales") == [(70, 7), (71, 7), (120, 12), (121, 12)]


# Dynamic partitions


@pytest.mark.parametrize("io_manager", ["io_manager", "merge_io_manager"])
def test_dynamic_partitions_are_scoped_like_static_ones(store: Store, io_manager: str) -> None:
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("stores", ["east", "north", "south"])
    cells = kind_asset(run_rows, DYNAMIC, ONE_DIM, io_manager)
    run(store, cells, first_last=("east", "north"), instance=instance)
    for key in ["south", "north"]:
        run(store, cells, key, instance=instance)
    expected = rows_of(*[sales(DAYS[0], r) for r in ["east", "north", "south"]])
    assert store.rows("sales") == expected

    def with_stray(context: dg.AssetExecutionContext) -> pa.Table:
        return pa.concat_tables([run_rows(context), sales(DAYS[0], "east").slice(0, 2)])

    stray = kind_asset(with_stray, DYNAMIC, ONE_DIM, io_manager)
    refused(store, stray, "south", ia.StrayRowsError, instance=instance)
    empty = kind_asset(lambda c: run_rows(c).slice(0, 0), DYNAMIC, ONE_DIM, io_manager)
    refused(store, empty, "north", ia.EmptyBatchError, instance=instance)
    assert store.rows("sales") == expected


# Multi-dimensional partitions: date x region


@pytest.mark.parametrize("io_manager", ["io_manager", "merge_io_manager"])
def test_multi_rerun_of_one_cell_leaves_every_other_cell(store: Store, io_manager: str) -> None:
    fill_multi(store, io_manager)
    once = store.snapshot()
    fill_multi(store, io_manager)
    assert store.snapshot() == once
    newer = kind_asset(lambda c: run_rows(c, version=3), MULTI, BY_DAY_AND_REGION, io_manager)
    run(store, newer, f"{DAYS[1]}|north")
    expected = [
        sales(day, region, 3 if (day, region) == (DAYS[1], "north") else 0)
        for day in DAYS
        for region in ("north", "south")
    ]
    assert store.rows("sales") == rows_of(*expected)


def test_multi_range_of_days_for_one_region_replaces_only_those_cells(store: Store) -> None:
    fill_multi(store)
    newer = kind_asset(lambda c: run_rows(c, version=5), MULTI, BY_DAY_AND_REGION)
    result = run(store, newer, first_last=(f"{DAYS[0]}|south", f"{DAYS[2]}|south"))
    assert written_counts(result) == {f"{day}|south": ROWS for day in DAYS}
    expected = [sales(d, "north") for d in DAYS] + [sales(d, "south", 5) for d in DAYS]
    assert store.rows("sales") == rows_of(*expected)


@pytest.mark.parametrize("dimension", ["date", "region"])
def test_multi_row_of_another_cell_is_refused(store: Store, dimension: str) -> None:
    fill_multi(store)
    other = sales(DAYS[2], "north") if dimension == "date" else sales(DAYS[1], "south")

    def with_stray(context: dg.AssetExecutionContext) -> pa.Table:
        return pa.concat_tables([run_rows(context), other.slice(5, 1)])

    asset = kind_asset(with_stray, MULTI, BY_DAY_AND_REGION)
    message = refused(store, asset, f"{DAYS[1]}|north", ia.StrayRowsError)
    assert f"1 of {ROWS + 1} rows have 'sold_at', 'region' outside the window" in message


def test_multi_range_with_an_empty_cell_is_refused(store: Store) -> None:
    fill_multi(store)

    def missing_a_day(context: dg.AssetExecutionContext) -> pa.Table:
        return run_rows(context).filter(pc.field("sold_at") < datetime(2026, 1, 3))

    asset = kind_asset(missing_a_day, MULTI, BY_DAY_AND_REGION)
    before = store.snapshot()
    with pytest.raises(ia.EmptyBatchError, match=r"2026-01-03\|north"):
        run(store, asset, first_last=(f"{DAYS[0]}|north", f"{DAYS[2]}|north"))
    assert store.snapshot() == before


def test_multi_merge_deletes_a_cells_missing_row_and_no_other(store: Store) -> None:
    fill_multi(store, "merge_io_manager")
    fewer = kind_asset(lambda c: run_rows(c).slice(1), MULTI, BY_DAY_AND_REGION, "merge_io_manager")
    result = run(store, fewer, f"{DAYS[0]}|south")
    metadata = result.get_asset_materialization_events()[0].materialization.metadata
    assert (metadata["rows_deleted"].value, metadata["rows_updated"].value) == (1, ROWS - 1)
    everything = rows_of(*[sales(d, r) for d in DAYS for r in ("north", "south")])
    dropped = rows_of(sales(DAYS[0], "south").slice(0, 1))[0]
    assert store.rows("sales") == [row for row in everything if row != dropped]


def test_keys_that_are_not_a_product_replace_only_themselves(store: Store) -> None:
    """Two keys of a multi range, (day 1, north) and (day 2, south), leave the other two cells."""
    fill_multi(store)
    keys = [f"{DAYS[0]}|north", f"{DAYS[1]}|south"]
    batch = pa.concat_tables([sales(DAYS[0], "north", 9), sales(DAYS[1], "south", 9)])
    write = settings("overwrite", BY_DAY_AND_REGION, table="sales", partitions_def=MULTI)
    window = ia.window_from_keys(MULTI, keys, "sales")
    with store.open() as backend:
        result = ia.publish(backend, batch, write, window, now=NOW)
    assert {k: p.rows for k, p in result.per_partition.items()} == dict.fromkeys(keys, ROWS)
    expected = [
        sales(d, r, 9 if f"{d}|{r}" in keys else 0) for d in DAYS for r in ("north", "south")
    ]
    assert store.rows("sales") == rows_of(*expected)
    with store.open() as backend:
        one_cell = ia.window_from_keys(MULTI, [f"{DAYS[0]}|south"], "sales")
        fingerprint = ia.table_fingerprint(
            backend, "main", "sales", BY_DAY_AND_REGION["partition_expr"], one_cell
        )
    assert fingerprint is not None and fingerprint.startswith(f"{ROWS}:")


# Multi-dimensional partitions: two static dimensions


def test_static_by_static_cells_are_replaced_alone(store: Store) -> None:
    cells = kind_asset(run_rows, GRID, BY_CHANNEL_AND_REGION)
    for channel in ["shop", "web"]:
        for region in ["east", "north"]:
            run(store, cells, f"{channel}|{region}")
    newer = kind_asset(lambda c: run_rows(c, version=2), GRID, BY_CHANNEL_AND_REGION)
    run(store, newer, "web|east")
    expected = [
        sales(DAYS[0], r, 2 if (c, r) == ("web", "east") else 0, channel=c)
        for c in ["shop", "web"]
        for r in ["east", "north"]
    ]
    assert store.rows("sales") == rows_of(*expected)

    def wrong_channel(context: dg.AssetExecutionContext) -> pa.Table:
        return pa.concat_tables([run_rows(context), sales(DAYS[0], "north", channel="web")])

    stray = kind_asset(wrong_channel, GRID, BY_CHANNEL_AND_REGION)
    refused(store, stray, "shop|north", ia.StrayRowsError)


@pytest.mark.parametrize("frame", [pa.Table, pa.RecordBatchReader], ids=["arrow", "streamed"])
def test_loading_a_multi_partition_reads_only_its_cell(store: Store, frame: type) -> None:
    """Streamed too, where a Delta file holds no value of the columns it is partitioned by."""
    fill_multi(store)
    seen: list[pa.Table] = []
    upstream = kind_asset(run_rows, MULTI, BY_DAY_AND_REGION)

    @dg.asset(partitions_def=MULTI, io_manager_key="io_manager", metadata=BY_DAY_AND_REGION)
    def reader(context: dg.AssetExecutionContext, sales: frame) -> pa.Table:  # type: ignore[valid-type]
        read = sales.read_all() if isinstance(sales, pa.RecordBatchReader) else sales
        seen.append(read)
        return read

    dg.materialize(
        [upstream.to_source_asset(), reader],
        resources=store.resources(),
        partition_key=f"{DAYS[1]}|south",
    )
    assert rows_of(seen[0]) == rows_of(sales(DAYS[1], "south"))


def test_partition_columns_named_in_another_case_are_written_and_read(store: Store) -> None:
    """Names match without regard to case on writes; a downstream load must match them too."""
    shouted = {**BY_DAY_AND_REGION, "partition_expr": {"date": "SOLD_AT", "region": "Region"}}
    upstream = kind_asset(run_rows, MULTI, shouted)
    seen: list[pa.Table] = []

    @dg.asset(partitions_def=MULTI, io_manager_key="io_manager", metadata=shouted)
    def reader(context: dg.AssetExecutionContext, sales: pa.Table) -> pa.Table:
        seen.append(sales)
        return sales

    for key in [f"{DAYS[0]}|north", f"{DAYS[1]}|north"]:
        dg.materialize([upstream, reader], resources=store.resources(), partition_key=key)
    assert rows_of(seen[1]) == rows_of(sales(DAYS[1], "north"))
    assert store.rows("reader") == rows_of(sales(DAYS[0], "north"), sales(DAYS[1], "north"))


def test_a_column_named_partition_key_is_only_data(store: Store) -> None:
    """Per-partition counts name their own column; a user column of that name must not bind."""
    labelled = kind_asset(
        lambda c: run_rows(c).append_column("partition_key", pa.array(["x"] * ROWS * 2)),
        STATIC,
        ONE_DIM,
    )
    result = run(store, labelled, first_last=("east", "north"))
    assert written_counts(result) == {"east": ROWS, "north": ROWS}
    assert len(store.rows("sales")) == 2 * ROWS


# A lone partition with no rows: the batch's untyped columns do not decide


def filtered_empty(context: dg.AssetExecutionContext) -> pa.Table:
    """The run's rows filtered to none in pandas, as a day with no sales comes out of a filter.

    An empty object column has no values, so Arrow gives it no type (``null``): the category
    column of such a batch is untyped.
    """
    frame = run_rows(context).to_pandas()
    batch = pa.Table.from_pandas(frame[frame["amount"] < 0], preserve_index=False)
    assert pa.types.is_null(batch.schema.field("region").type)
    return batch


@pytest.mark.parametrize(
    ("partitions_def", "metadata", "key"),
    [
        (STATIC, ONE_DIM, "south"),
        (MULTI, BY_DAY_AND_REGION, f"{DAYS[1]}|south"),
    ],
    ids=["static", "day_by_region"],
)
def test_a_lone_empty_partition_is_refused_as_empty_or_stored_empty_when_declared(
    store: Store, partitions_def: dg.PartitionsDefinition, metadata: dict[str, Any], key: str
) -> None:
    if partitions_def is STATIC:
        fill_static(store)
    else:
        fill_multi(store)
    before = store.rows("sales")
    empty = kind_asset(filtered_empty, partitions_def, metadata)
    message = refused(store, empty, key, ia.EmptyBatchError)
    assert f"partition {key}: the batch is empty but the window holds {ROWS} rows" in message

    declared = kind_asset(filtered_empty, partitions_def, {**metadata, "allow_empty": True})
    result = run(store, declared, key)
    assert written_counts(result) == {key: 0}
    region = key.split("|")[-1]
    day = key.split("|")[0] if "|" in key else DAYS[0]
    # Only the cell's rows are gone.
    assert store.rows("sales") == [
        row for row in before if not (row[2] == region and row[1].date().isoformat() == day)
    ]
