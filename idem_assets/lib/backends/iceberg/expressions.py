"""A window's region as a pyiceberg row filter, and the partition spec a new table gets.

The filter is the one predicate builder's (:func:`idem_assets.lib.sql.predicates.region`) tree,
each node turned into pyiceberg's: ``ts >= start AND ts < end`` per span, ``region IN (...)`` per
category, on the source columns. pyiceberg projects it onto the spec itself, inclusively to plan
the files a read needs and strictly to tell the files whose every row lies inside. Values are
bound, never text pasted into a statement: each placeholder becomes its value, which pyiceberg
binds to the column's type.
"""

# pyiceberg's predicates are pydantic models with a positional __init__ pyright cannot see.
# pyright: reportCallIssue=false
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    GreaterThanOrEqual,
    In,
    LessThan,
    Or,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform, IdentityTransform
from sqlglot import exp

from idem_assets.lib.model.windows import Bound, Box, Region
from idem_assets.lib.sql import predicates

#: The first partition field id of a spec (Iceberg's convention).
_FIRST_PARTITION_FIELD = 1000


def literal(value: Bound, column_type: pa.DataType) -> str:
    """A window bound as the ISO text pyiceberg binds to ``column_type`` exactly."""
    if pa.types.is_date(column_type):
        return (value.date() if isinstance(value, datetime) else value).isoformat()
    if not isinstance(value, datetime):
        value = datetime.combine(value, datetime.min.time())
    if pa.types.is_timestamp(column_type) and column_type.tz is not None:
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC).isoformat(timespec="microseconds")
    return value.replace(tzinfo=None).isoformat(timespec="microseconds")


def region_filter(region: Region, types: Mapping[str, pa.DataType]) -> BooleanExpression:
    """Rows in any box of ``region``; the whole table (``AlwaysTrue``) without a region."""
    params = predicates.Params()
    tree = predicates.region(region, params)
    return _converted(tree, params.values, types)


def box_filter(box: Box, types: Mapping[str, pa.DataType]) -> BooleanExpression:
    """Rows meeting every condition of ``box``."""
    return region_filter((box,), types)


def _converted(
    node: exp.Expr, values: Sequence[Any], types: Mapping[str, pa.DataType]
) -> BooleanExpression:
    """The builder's tree as pyiceberg's expression, its placeholders bound to ``values``."""
    if isinstance(node, exp.Paren):
        return _converted(node.this, values, types)
    if isinstance(node, exp.Boolean) and node.this is True:
        return AlwaysTrue()
    if isinstance(node, exp.Or | exp.And):
        combine = Or if isinstance(node, exp.Or) else And
        return combine(
            _converted(node.this, values, types), _converted(node.expression, values, types)
        )
    if isinstance(node, exp.GTE | exp.LT) and isinstance(node.this, exp.Column):
        name = node.this.name
        value = literal(values[int(node.expression.name) - 1], types[name])
        return (GreaterThanOrEqual if isinstance(node, exp.GTE) else LessThan)(name, value)
    if isinstance(node, exp.In) and isinstance(node.this, exp.Column):
        return In(node.this.name, [values[int(p.name) - 1] for p in node.expressions])
    raise TypeError(f"no Iceberg row filter for the predicate node {node.sql()!r}")


def partition_spec(
    schema: Schema, time_column: str | None, categories: Sequence[str]
) -> PartitionSpec:
    """The spec of a new table: the time column's day (``<column>_day``), then each category.

    A day per partition (not an hour, whatever the partitions' size) keeps files few; a window
    finer than a day reads and rewrites its day's files only. Category columns are identity
    fields, so each key's rows sit in files of their own.
    """
    fields = []
    if time_column is not None:
        fields.append(
            PartitionField(
                source_id=schema.find_field(time_column).field_id,
                field_id=_FIRST_PARTITION_FIELD,
                transform=DayTransform(),
                # pyiceberg refuses a derived field named like its source column.
                name=f"{time_column}_day",
            )
        )
    for column in categories:
        fields.append(
            PartitionField(
                source_id=schema.find_field(column).field_id,
                field_id=_FIRST_PARTITION_FIELD + len(fields),
                transform=IdentityTransform(),
                name=column,
            )
        )
    return PartitionSpec(*fields)
