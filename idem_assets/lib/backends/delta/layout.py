"""How the Delta backend lays a table out and names its rows: paths, the day column, predicates.

Layout: ``<root>/<schema>/<table>``, partitioned by a derived day column (:data:`DAY_COLUMN`, the
time column's date, in UTC for time-zone-aware columns) when the partitions have a time
dimension, then by each category (static or dynamic) dimension's own column
(:func:`delta_partitions`), so writers of different partitions touch different files and both
commit. The day column is the library's own: it never reaches a fingerprint, the schema checks
or a load; a table another tool made has none, and is written in its own layout.

Delta takes predicates as text, so the window's predicate is the one builder's
(:mod:`idem_assets.lib.sql.predicates`) with typed literals in place of its placeholders.
"""

import os
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from idem_assets.lib.model.identifiers import validate_identifier
from idem_assets.lib.model.settings import WriteSettings
from idem_assets.lib.model.windows import Bound, Box, Condition, Region
from idem_assets.lib.sql import predicates

#: The derived partition column; not a plain identifier, so no user column can be called so.
DAY_COLUMN = "idem-day"
#: The table's name (Delta metadata) is this prefix and the asset key of the table's owner.
OWNER_PREFIX = "idem_assets:"
_ARROW_UNITS = {"s": "Second", "ms": "Millisecond", "us": "Microsecond", "ns": "Nanosecond"}


def table_uri(root: str, schema: str, table: str) -> str:
    """Where ``schema.table`` lives under ``root`` (names lower-cased, as DuckDB compares them)."""
    validate_identifier(schema, "schema")
    validate_identifier(table, "table")
    return f"{root.rstrip('/')}/{schema.lower()}/{table.lower()}"


def literal(value: Bound, column_type: pa.DataType) -> str:
    """A literal of exactly ``column_type``, so a comparison can neither fail nor coerce."""
    # Delta predicates are text: there is nothing to bind. The values are window bounds
    # (date and datetime objects), whose ISO form holds no quote.
    if pa.types.is_timestamp(column_type):
        if not isinstance(value, datetime):
            value = datetime.combine(value, datetime.min.time())
        unit = _ARROW_UNITS[column_type.unit]
        if column_type.tz is not None:
            text = value.astimezone(UTC).isoformat(timespec="microseconds")
            return f"arrow_cast('{text}', 'Timestamp({unit}, Some(\"{column_type.tz}\"))')"
        text = value.isoformat(timespec="microseconds")
        return f"arrow_cast('{text}', 'Timestamp({unit}, None)')"
    if pa.types.is_date32(column_type):
        day = value.date() if isinstance(value, datetime) else value
        return f"arrow_cast('{day.isoformat()}', 'Date32')"
    raise TypeError(f"no Delta literal for a partition column of type {column_type}")


def category_literal(value: object) -> str:
    """A category value as a Delta literal: text quoted (quotes doubled), an integer as digits."""
    # Delta predicates are text: there is nothing to bind. Delta's SQL reads a backslash as
    # itself, so doubling the quote is the whole escape and no value can end the literal.
    if isinstance(value, int) and not isinstance(value, bool):
        return str(int(value))
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise TypeError(f"no Delta literal for the category value {value!r}")


def utc_day(value: Bound) -> date:
    """The date of ``value``: an aware time's UTC date, a naive time's own, a date itself."""
    if isinstance(value, datetime):
        return (value.astimezone(UTC) if value.tzinfo else value).date()
    return value


def day_span(start: Bound, end: Bound) -> tuple[date, date]:
    """The half-open range of :data:`DAY_COLUMN` values a span's rows can have."""
    last = end - timedelta(microseconds=1) if isinstance(end, datetime) else end - timedelta(1)
    return utc_day(start), utc_day(last) + timedelta(days=1)


@dataclass(frozen=True)
class Typed:
    """A window value with its column's type, for the literal that stands in for it."""

    value: Any
    type: pa.DataType


def typed_literal(typed: Typed) -> str:
    """A window value as a Delta literal of its column's type."""
    if pa.types.is_timestamp(typed.type) or pa.types.is_date32(typed.type):
        return literal(typed.value, typed.type)
    return category_literal(typed.value)


def with_days(region: Region, time_column: str | None) -> Region:
    """The region with, beside each span of the time column, the span of its days.

    The day conjuncts follow from the others; they let Delta prune files by partition and tell
    a concurrent writer of another day apart from one of the same day.
    """
    out = []
    for box in region:
        conds: list[Condition] = []
        for cond in box:
            if cond.spans and cond.column == time_column:
                conds.append(Condition(DAY_COLUMN, spans=tuple(day_span(*s) for s in cond.spans)))
            conds.append(cond)
        out.append(tuple(conds))
    return tuple(out)


def predicate(
    region: Region,
    types: Mapping[str, pa.DataType],
    alias: str | None = None,
    partitioned: bool = True,
) -> str:
    """The region as a Delta predicate: the one builder's, with typed literals inlined.

    ``partitioned``: the table has :data:`DAY_COLUMN`, so each time span also names its days.
    """
    time_column = next((c.column for b in region for c in b if c.spans), None)
    if partitioned:
        region = with_days(region, time_column)
    kinds = {**types, DAY_COLUMN: pa.date32()}
    # Each value travels with its column's type, so the literal standing in for it is typed.
    typed: Region = tuple(
        tuple(
            Condition(
                c.column,
                spans=cast(
                    Any,
                    tuple(
                        (Typed(s, kinds[c.column]), Typed(e, kinds[c.column])) for s, e in c.spans
                    ),
                ),
                values=cast(Any, tuple(Typed(v, kinds[c.column]) for v in c.values)),
            )
            for c in box
        )
        for box in region
    )
    params = predicates.Params()
    tree = predicates.region(typed, params, alias)
    return predicates.inline(tree, params.values, typed_literal)


def window_predicate(
    column: str,
    column_type: pa.DataType,
    spans: Sequence[tuple[Bound, Bound]],
    alias: str | None = None,
) -> str:
    """One time column inside any of ``spans`` (with their days), as a Delta predicate."""
    validate_identifier(column, "partition column")
    region = ((Condition(column, spans=tuple(spans)),),)
    return predicate(region, {column: column_type}, alias=alias)


def owner_of(table: DeltaTable) -> str | None:
    """The asset that owns ``table``, from its name; ``None`` for a table of another writer."""
    name = table.metadata().name
    return name[len(OWNER_PREFIX) :] if name and name.startswith(OWNER_PREFIX) else None


def region_filter(
    region: Region, partition_by: Sequence[str]
) -> list[list[tuple[str, str, Any]]] | None:
    """The region as file-pruning filters on the table's partition columns, or ``None``.

    One conjunction per box and span: its days (when the table is partitioned by day) and its
    categories' values (when partitioned by their columns). A box with nothing to prune by
    needs every file, and so does the region.
    """
    conjunctions = []
    for box in region:
        days: list[tuple[date, date] | None] = [None]
        categories: list[tuple[str, str, Any]] = []
        for cond in box:
            if cond.spans and DAY_COLUMN in partition_by:
                days = [day_span(s, e) for s, e in cond.spans]
            elif cond.values and cond.column in partition_by:
                categories.append((cond.column, "in", list(cond.values)))
        for span in days:
            conjunction = list(categories)
            if span is not None:
                conjunction += [(DAY_COLUMN, ">=", span[0]), (DAY_COLUMN, "<", span[1])]
            if not conjunction:
                return None
            conjunctions.append(conjunction)
    return conjunctions or None


def delta_partitions(settings: WriteSettings, batch: pa.Schema) -> list[str]:
    """The partition columns a new table gets: the derived day, then each category column.

    A category dimension's column is a Delta partition column itself: its values are the
    partition keys, so each key's rows sit in files of their own (as many directories as Dagster
    has partitions). An overwrite of one key then drops only its files, a read of one key opens
    only them, and writers of different keys commit side by side, as writers of different days
    do. A time column is never one (a directory per instant): its day is. Without any
    partition dimension the table is not partitioned.
    """
    day = [DAY_COLUMN] if DAY_COLUMN in batch.names else []
    return day + [c for c in settings.partition_names if c != settings.time_column]


def with_day(batch: pa.Table, column: str | None) -> pa.Table:
    """The batch with :data:`DAY_COLUMN` appended (the date of ``column``, UTC when aware)."""
    if column is None:
        return batch
    values = batch.column(column)
    if not pa.types.is_date32(values.type):
        # Arrow keeps instants in UTC: the cast takes an aware timestamp's UTC date.
        days = pc.floor_temporal(values, unit="day")  # pyright: ignore[reportAttributeAccessIssue]
        values = pc.cast(days, pa.date32())
    return batch.append_column(pa.field(DAY_COLUMN, pa.date32()), values)


def quote_key(value: object) -> str:
    """A partition value as delta-rs writes it in a path: every byte but A-Z a-z 0-9 -._~ as %XX."""
    # delta-rs percent-encodes the controls and every ASCII punctuation but -._~, and UTF-8.
    return urllib.parse.quote(str(value), safe="")


def file_in_box(stats: Mapping[str, list[Any]], i: int, box: Box) -> bool | None:
    """Whether every row of file ``i`` is in ``box`` (True), none is (False), or it is unknown.

    ``stats`` holds the files' partition values and statistics by column (``min.<column>``).
    """
    verdicts = [file_meets(stats, i, cond) for cond in box]
    if any(v is False for v in verdicts):
        return False
    return True if all(v is True for v in verdicts) else None


def file_meets(stats: Mapping[str, list[Any]], i: int, cond: Condition) -> bool | None:
    """Whether every row of file ``i`` meets ``cond`` (True), none does (False), or unknown."""
    if cond.values:
        # A category is known from the file's partition value; text statistics may be
        # truncated, so a category column Delta does not partition by is read.
        values = stats.get(f"partition.{cond.column}")
        if values is None:
            return None
        # Partition values may come back as text: compare both sides as text.
        return values[i] is not None and str(values[i]) in {str(v) for v in cond.values}
    lows, highs = stats.get(f"min.{cond.column}"), stats.get(f"max.{cond.column}")
    if lows is None or highs is None:
        return None
    low, high = lows[i], highs[i]
    if low is None or high is None:
        return None
    # Delta keeps timestamp statistics in milliseconds, truncated: the true maximum lies
    # below the recorded one plus a millisecond.
    above = high + (timedelta(milliseconds=1) if isinstance(high, datetime) else timedelta(days=1))
    if any(start <= low and above <= end for start, end in cond.spans):
        return True
    if any(above > start and low < end for start, end in cond.spans):
        return None
    return False


def delta_tables(root: str) -> list[tuple[str, str]]:
    """``(schema, table)`` of every Delta table under a local ``root``."""
    found = []
    if not os.path.isdir(root):
        return found
    for schema in sorted(os.listdir(root)):
        for table in sorted(os.listdir(os.path.join(root, schema))):
            if os.path.isdir(os.path.join(root, schema, table, "_delta_log")):
                found.append((schema, table))
    return found
