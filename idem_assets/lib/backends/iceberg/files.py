"""Which data files a publish reads, drops or rewrites, decided from metadata where it can be.

A file whose partition lies wholly inside the window (the strict projection of the window onto
the spec, evaluated on the file's partition record) is dropped or counted whole, without a read;
only a file the window covers in part (an hour of a day partition), or one holding rows a delete
file removes, is read. A merge reads only the window's files whose key bounds hold a key of the
batch (pyiceberg's own delete binds an ``IN`` of every key, which is what makes its upsert slow).

Private pyiceberg API: ``pyiceberg.io.pyarrow.ArrowScan`` reads a chosen set of files projected
to the current schema (pyiceberg 0.12 is pinned, and tests/iceberg cover it).
"""

# pyarrow.compute builds its functions at import time, so a type checker cannot see them.
# pyright: reportAttributeAccessIssue=false
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.expressions.visitors import expression_evaluator, strict_projection
from pyiceberg.io.pyarrow import ArrowScan
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Table
from pyiceberg.table.metadata import TableMetadata

from idem_assets.lib.backends.iceberg.expressions import region_filter
from idem_assets.lib.backends.iceberg.types import arrow_columns
from idem_assets.lib.model.windows import Region
from idem_assets.lib.sql import predicates

FileTest = Callable[[DataFile], bool]


def plan(
    table: Table, row_filter: BooleanExpression, snapshot_id: int | None = None
) -> list[FileScanTask]:
    """The files a scan of ``row_filter`` must open (partition and column-statistics pruning)."""
    return list(table.scan(row_filter=row_filter, snapshot_id=snapshot_id).plan_files())


def inside(metadata: TableMetadata, row_filter: BooleanExpression) -> FileTest:
    """True for a data file whose partition lies wholly inside ``row_filter`` (no read needed)."""
    evaluators: dict[int, Callable[[Any], bool]] = {}
    schema = metadata.schema()

    def test(data_file: DataFile) -> bool:
        spec_id = data_file.spec_id
        if spec_id not in evaluators:
            spec = metadata.specs()[spec_id]
            if spec.is_unpartitioned():
                evaluators[spec_id] = lambda _: False
            else:
                projected = strict_projection(schema, spec, True)(row_filter)
                partition_schema = Schema(*spec.partition_type(schema).fields)
                evaluators[spec_id] = expression_evaluator(partition_schema, projected, True)
        return evaluators[spec_id](data_file.partition)

    return test


def whole(task: FileScanTask) -> bool:
    """Whether a file's record count is its rows (no delete file removes any of them)."""
    return not task.delete_files


def key_overlap(schema: Schema, key: str, keys: pa.Array) -> FileTest:
    """True for a data file whose ``key`` bounds may hold one of ``keys`` (or has no bounds)."""
    field = schema.find_field(key)
    values = keys.drop_null()
    if not len(values):
        return lambda _: False
    if pa.types.is_timestamp(values.type) or pa.types.is_date(values.type):
        # Bounds decode to Iceberg's integers (days, microseconds): compare those.
        values = values.cast(pa.int64() if pa.types.is_timestamp(values.type) else pa.int32())
    try:
        ordered = np.sort(values.to_numpy(zero_copy_only=False))
    except TypeError:
        return lambda _: True

    def test(data_file: DataFile) -> bool:
        lower = (data_file.lower_bounds or {}).get(field.field_id)
        upper = (data_file.upper_bounds or {}).get(field.field_id)
        if lower is None or upper is None:
            return True
        low = from_bytes(field.field_type, lower)
        high = from_bytes(field.field_type, upper)
        try:
            # A truncated text bound still bounds: the upper one is rounded up.
            i = int(np.searchsorted(ordered, low, side="left"))  # pyright: ignore[reportCallIssue, reportArgumentType]
            return bool(i < len(ordered) and ordered[i] <= high)
        except TypeError:
            return True

    return test


def read(
    metadata: TableMetadata,
    table: Table,
    tasks: Sequence[FileScanTask],
    columns: Sequence[str] = (),
) -> pa.Table:
    """The rows of ``tasks`` (delete files applied) in the current schema, or its ``columns``."""
    schema = metadata.schema()
    if columns:
        schema = schema.select(*columns)
    return ArrowScan(
        table_metadata=metadata, io=table.io, projected_schema=schema, row_filter=AlwaysTrue()
    ).to_table(tasks)


def in_region(rows: pa.Table, region: Region) -> pa.Table:
    """The ``rows`` in ``region`` (every row without one; NULL partition values lie in none)."""
    if not region:
        return rows
    return rows.filter(predicates.arrow_expression(region, _types(rows)))


def outside_region(rows: pa.Table, region: Region) -> pa.Table:
    """The ``rows`` not in ``region``, those with a NULL partition value among them."""
    if not region:
        return rows.slice(0, 0)
    inside = predicates.arrow_expression(region, _types(rows))
    # A NULL comparison is unknown: such a row is not in the region, so it is kept.
    return rows.filter(~inside | inside.is_null())


def _types(rows: pa.Table) -> dict[str, pa.DataType]:
    return {f.name: f.type for f in rows.schema}


def without_keys(rows: pa.Table, batch: pa.Table, key: Sequence[str]) -> pa.Table:
    """``rows`` whose key the batch does not hold."""
    if len(key) == 1:
        keys = batch.column(key[0]).cast(rows.schema.field(key[0]).type)
        return rows.filter(pc.invert(pc.is_in(rows.column(key[0]), value_set=keys)))
    wanted = {k: rows.schema.field(k).type for k in key}
    keys = pa.table({k: batch.column(k).cast(t) for k, t in wanted.items()})
    return rows.join(keys, keys=list(key), join_type="left anti")


def counts(
    metadata: TableMetadata,
    tasks: Sequence[FileScanTask],
    cells: Mapping[str | None, BooleanExpression],
) -> tuple[dict[str | None, int], list[FileScanTask]]:
    """Rows per cell from the files' record counts, and the files only a read can count."""
    tests = {key: inside(metadata, expr) for key, expr in cells.items()}
    found: dict[str | None, int] = {}
    unread: list[FileScanTask] = []
    for task in tasks:
        cell = [k for k, test in tests.items() if whole(task) and test(task.file)]
        if cell:
            found[cell[0]] = found.get(cell[0], 0) + task.file.record_count
        else:
            unread.append(task)
    return found, unread


def region_rows(
    table: Table,
    region: Region,
    snapshot_id: int | None = None,
    columns: Sequence[str] | None = None,
) -> tuple[pa.Table, int]:
    """The rows of ``table`` (at ``snapshot_id``) in ``region``, and how many files were read.

    Only the files the region's partitions and column statistics allow are planned; the rows
    come back in the types a scan returns. ``columns``: only those (the region's are added).
    """
    stored = arrow_columns(table.schema())
    tasks = plan(table, region_filter(region, stored), snapshot_id)
    wanted = list(stored) if columns is None else list(columns)
    wanted += [c.column for b in region for c in b if c.column not in wanted]
    rows = in_region(read(table.metadata, table, tasks, wanted if columns else ()), region)
    return rows.cast(pa.schema([pa.field(c, stored[c]) for c in rows.column_names])), len(tasks)
