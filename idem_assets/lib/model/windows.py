"""Partition windows: which slice of time one write is responsible for.

Windows are half-open (``start <= t < end``). A run may cover one partition or a contiguous range
of them (a chunked backfill); either way the write is scoped to exactly those partitions.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time

import dagster as dg
import pyarrow as pa

from idem_assets.lib.model import expressions
from idem_assets.lib.model.errors import ConfigurationError, SchemaMismatchError

#: A window boundary as a column compares it: a date for a date column, else a datetime.
Bound = datetime | date


#: The dimension name of a one-dimensional partitions definition (a multi one names its own).
ONLY = ""


@dataclass(frozen=True)
class PartitionWindow:
    """One partition key: its half-open time window and its value in each category dimension."""

    key: str
    #: ``None`` for a partition without a time dimension (static or dynamic partitions).
    start: datetime | None = None
    end: datetime | None = None
    #: ``(dimension, value)`` for each static or dynamic dimension, in dimension order.
    values: tuple[tuple[str, str], ...] = ()

    def sort_key(self) -> tuple[float, tuple[tuple[str, str], ...]]:
        """Time first (by instant), then the category values."""
        # By instant: datetimes in one zone compare by wall clock, so the two 01:00s would tie.
        return (self.start.timestamp() if self.start else 0.0, self.values)


@dataclass(frozen=True)
class WriteWindow:
    """The partitions one run writes, in time order (then category order)."""

    partitions: tuple[PartitionWindow, ...]
    #: The time dimension's name (:data:`ONLY` for time-window partitions), ``None`` when none.
    time_dimension: str | None = ONLY

    def __post_init__(self) -> None:
        if not self.partitions:
            raise ValueError("a WriteWindow needs at least one partition")

    @property
    def timed(self) -> bool:
        """Whether the partitions have a time dimension."""
        return self.time_dimension is not None and self.partitions[0].start is not None

    @property
    def start(self) -> datetime:
        """Start of the earliest partition (timed windows only)."""
        return min((p.start for p in self.partitions if p.start), key=datetime.timestamp)

    @property
    def end(self) -> datetime:
        """End of the latest partition (timed windows only)."""
        return max((p.end for p in self.partitions if p.end), key=datetime.timestamp)

    @property
    def keys(self) -> list[str]:
        """Partition keys in time order."""
        return [p.key for p in self.partitions]

    def spans(self) -> list[tuple[datetime, datetime]]:
        """Contiguous ``(start, end)`` spans covering the partitions' times (one for a range)."""
        times = sorted(
            {(p.start, p.end) for p in self.partitions if p.start and p.end},
            key=lambda t: t[0].timestamp(),
        )
        spans: list[tuple[datetime, datetime]] = []
        for start, end in times:
            if spans and spans[-1][1] == start:
                spans[-1] = (spans[-1][0], end)
            else:
                spans.append((start, end))
        return spans

    def categories(self) -> dict[str, list[str]]:
        """Each category dimension's values among the partitions, in first-seen order."""
        found: dict[str, dict[str, None]] = {}
        for p in self.partitions:
            for dim, value in p.values:
                found.setdefault(dim, {})[value] = None
        return {dim: list(values) for dim, values in found.items()}

    def is_product(self) -> bool:
        """Whether the partitions are every combination of their times and category values."""
        size = len({(p.start, p.end) for p in self.partitions})
        for values in self.categories().values():
            size *= len(values)
        return size == len(self.partitions)

    def describe(self) -> str:
        """Human-readable partition list, e.g. ``2026-01-01...2026-01-03 (3 partitions)``."""
        if len(self.partitions) == 1:
            return self.partitions[0].key
        first, last = self.partitions[0].key, self.partitions[-1].key
        return f"{first}...{last} ({len(self.partitions)} partitions)"


def window_from_keys(
    partitions_def: dg.PartitionsDefinition, keys: Sequence[str], asset: str
) -> WriteWindow:
    """Build the window of ``keys`` from a time-window, static, dynamic or multi definition."""
    keys = list(dict.fromkeys(keys))
    if isinstance(partitions_def, dg.TimeWindowPartitionsDefinition):
        parts = [_time_partition(partitions_def, key, key, asset) for key in keys]
        time_dimension: str | None = ONLY
    elif isinstance(partitions_def, dg.MultiPartitionsDefinition):
        parts = [_multi_partition(partitions_def, key, asset) for key in keys]
        timed = partitions_def.time_window_dimension if _has_time(partitions_def) else None
        time_dimension = timed.name if timed else None
    elif isinstance(partitions_def, dg.StaticPartitionsDefinition | dg.DynamicPartitionsDefinition):
        for key in keys:
            _check_category(partitions_def, ONLY, key, asset)
        parts = [PartitionWindow(key=key, values=((ONLY, key),)) for key in keys]
        time_dimension = None
    else:
        raise ConfigurationError(
            f"Asset '{asset}' uses {type(partitions_def).__name__}, which idem_assets cannot scope"
            " a write by. Nothing was changed. Fix: use time-window partitions (e.g."
            " dg.DailyPartitionsDefinition(start_date=...)), static or dynamic partitions, or a"
            " dg.MultiPartitionsDefinition of them."
        )
    parts.sort(key=PartitionWindow.sort_key)
    return WriteWindow(tuple(parts), time_dimension)


def _has_time(partitions_def: dg.MultiPartitionsDefinition) -> bool:
    return any(
        isinstance(d.partitions_def, dg.TimeWindowPartitionsDefinition)
        for d in partitions_def.partitions_defs
    )


def _multi_partition(
    partitions_def: dg.MultiPartitionsDefinition, key: str, asset: str
) -> PartitionWindow:
    """One multi-dimensional key: its time dimension's window and its category values."""
    try:
        by_dim = partitions_def.get_partition_key_from_str(key).keys_by_dimension
    except Exception as exc:  # Dagster raises CheckError or ValueError for a malformed key.
        dims = [d.name for d in partitions_def.partitions_defs]
        raise ConfigurationError(
            f"Asset '{asset}': partition key {key!r} is not a key of its MultiPartitionsDefinition"
            f" (dimensions {dims}, values joined by '|' in that order), so there is no window to"
            " write. Nothing was changed. Fix: pass a key such as"
            f" {partitions_def.get_first_partition_key()!r}."
        ) from exc
    start = end = None
    values = []
    for dim in partitions_def.partitions_defs:
        value = by_dim[dim.name]
        if isinstance(dim.partitions_def, dg.TimeWindowPartitionsDefinition):
            timed = _time_partition(dim.partitions_def, value, key, asset)
            start, end = timed.start, timed.end
        else:
            _check_category(dim.partitions_def, dim.name, value, asset)
            values.append((dim.name, value))
    return PartitionWindow(key=key, start=start, end=end, values=tuple(values))


def _check_category(
    partitions_def: dg.PartitionsDefinition, dimension: str, value: str, asset: str
) -> None:
    """Refuse a static key its definition does not list (dynamic keys Dagster has checked)."""
    if isinstance(partitions_def, dg.DynamicPartitionsDefinition):
        return
    if not isinstance(partitions_def, dg.StaticPartitionsDefinition):
        raise ConfigurationError(
            f"Asset '{asset}': dimension {dimension!r} uses {type(partitions_def).__name__};"
            " idem_assets scopes a dimension by a time window or by category values only."
            " Nothing was changed. Fix: make it a dg.StaticPartitionsDefinition or a"
            " dg.DynamicPartitionsDefinition."
        )
    known = partitions_def.get_partition_keys()
    if value not in known:
        named = f" dimension {dimension!r}" if dimension else ""
        raise ConfigurationError(
            f"Asset '{asset}': partition key {value!r} is not a partition of its"
            f" StaticPartitionsDefinition{named} (keys {known[:10]}), so there is no window to"
            f" write. Nothing was changed. Fix: pass one of its keys, e.g. {known[0]!r}, or add"
            " it to the definition."
        )


def _time_partition(
    partitions_def: dg.TimeWindowPartitionsDefinition, key: str, full_key: str, asset: str
) -> PartitionWindow:
    """The half-open window of one time-window key, or a refusal naming the definition's keys."""
    # Dagster parses any date, so a key before the start, or spelt "2026-1-2", would
    # still get a window; only the key the definition itself gives that window's start is
    # a partition (on a fall-back day that key carries an offset: 2026-11-01-01:00-0500).
    try:
        tw = partitions_def.time_window_for_partition_key(key)
        own_key = partitions_def.get_partition_key_for_timestamp(tw.start.timestamp())
    except ValueError:
        tw, own_key = None, None
    start, end, fmt = partitions_def.start, partitions_def.end, partitions_def.fmt
    if tw is None or own_key != key or tw.start < start or (end is not None and tw.end > end):
        first = partitions_def.get_first_partition_key() or start.strftime(fmt)
        span = f"from {first}" + (f" to {end.strftime(fmt)}" if end else "")
        raise ConfigurationError(
            f"Asset '{asset}': partition key {key!r} is not a partition of its"
            f" {type(partitions_def).__name__} (keys formatted {fmt!r}, {span}), so there is"
            " no window to write. Nothing was changed. Fix: pass a key of the definition,"
            f" e.g. {first!r}, or widen the definition (start_date/end_date)."
        )
    return PartitionWindow(key=full_key, start=tw.start, end=tw.end)


def window_from_context(
    context: dg.OutputContext | dg.InputContext, asset: str
) -> WriteWindow | None:
    """The run's window for a partitioned asset, or ``None`` when the asset is unpartitioned."""
    if not context.has_asset_partitions:
        return None
    keys = list(context.asset_partition_keys)
    if not keys:
        return None
    return window_from_keys(context.asset_partitions_def, keys, asset)


def bound_for(value: datetime, column_type: pa.DataType) -> datetime | date:
    """Convert a window boundary to a value comparable with a column of Arrow ``column_type``.

    Naive timestamp columns hold wall-clock time in the partitions' timezone, so the timezone
    is dropped after conversion rather than shifted to UTC. A boundary the column cannot
    express exactly (an hour on a date column, a repeated hour on a naive one) is a
    configuration error: the window would match the wrong rows, or none.
    """
    if pa.types.is_date(column_type):
        if value.time() != time(0):
            raise ConfigurationError(_finer_than_a_day(value))
        return value.date()
    if pa.types.is_timestamp(column_type) and column_type.tz is not None:
        return value
    wall_clock = value.replace(tzinfo=None)
    # Read back as the first of two repeated hours, a wall-clock bound must be the same instant.
    first = wall_clock.replace(tzinfo=value.tzinfo, fold=0)
    if value.tzinfo is not None and first.timestamp() != value.timestamp():
        raise ConfigurationError(_repeated_hour(value))
    return wall_clock


def spans_for(window: WriteWindow, column_type: pa.DataType) -> list[tuple[Bound, Bound]]:
    """The window's half-open spans in a column of ``column_type``."""
    return [(bound_for(s, column_type), bound_for(e, column_type)) for s, e in window.spans()]


@dataclass(frozen=True)
class Condition:
    """One partition column's part of a window: inside any of ``spans``, or one of ``values``."""

    column: str
    #: Half-open ``(start, end)`` spans, for the time dimension's column.
    spans: tuple[tuple[Bound, Bound], ...] = ()
    #: The values the column may hold, for a category (static or dynamic) dimension's column.
    values: tuple[object, ...] = ()


#: Rows meeting every condition: one partition, or a product of several.
Box = tuple[Condition, ...]
#: Rows in any of the boxes: what one run may write.
Region = tuple[Box, ...]
#: One partition of a range with its box, for per-partition counts.
Cell = tuple[str, Box]


def as_pairs(partition_columns: object) -> tuple[tuple[str, str], ...]:
    """``partition_expr`` as ``(dimension, column)`` pairs: a column, a dict, or pairs already."""
    if partition_columns is None:
        return ()
    if isinstance(partition_columns, str):
        return ((ONLY, partition_columns),)
    if isinstance(partition_columns, Mapping):
        return tuple((str(d), str(c)) for d, c in partition_columns.items())
    return tuple((str(d), str(c)) for d, c in partition_columns)  # type: ignore[union-attr]


def region_of(
    window: WriteWindow | None,
    partition_columns: object,
    type_of: Callable[[str], pa.DataType],
    table: str,
) -> Region:
    """A stored table's region for ``window`` (none without one, or without a partition column).

    ``partition_columns`` is the metadata's form (see :func:`as_pairs`); ``type_of`` gives a
    stored column's Arrow type and raises ``KeyError`` for a column the table lacks. A column
    named in another case than stored is matched, as writes match it, when ``type_of`` is a
    mapping's lookup (:func:`stored_region`).
    """
    pairs = as_pairs(partition_columns)
    if window is None or not pairs:
        return ()
    try:
        types = {c: _term_type(c, type_of) for _, c in pairs}
    except KeyError as exc:
        raise SchemaMismatchError(
            f"Refused: table {table} has no partition column {exc}, which the asset's"
            f" partition_expr names ({dict(pairs)!r}), so no row can be placed in a partition."
            " Nothing was changed. Fix: name the table's column in metadata={'partition_expr':"
            " ...}, or add the column (ALTER TABLE ... ADD COLUMN) and rerun its partitions."
        ) from exc
    return region_for(window, pairs, types)


def stored_region(
    window: WriteWindow | None,
    partition_columns: object,
    columns: Mapping[str, pa.DataType],
    table: str,
) -> Region:
    """:func:`region_of` over a table's ``columns``, each partition column spelt as stored."""
    by_lower = {c.lower(): c for c in columns}

    def spelt(name: str) -> str:
        return by_lower.get(name.lower(), name)

    pairs = tuple((d, expressions.respelt(c, spelt)) for d, c in as_pairs(partition_columns))
    return region_of(window, pairs, columns.__getitem__, table)


def _term_type(term: str, type_of: Callable[[str], pa.DataType]) -> pa.DataType:
    """A partition term's type: a column's own, an expression's result (its columns must exist)."""
    if not expressions.is_expression(term):
        return type_of(term)
    for name in expressions.inputs(term):
        type_of(name)
    return expressions.result_type(term)


def region_for(
    window: WriteWindow, columns: Sequence[tuple[str, str]], types: Mapping[str, pa.DataType]
) -> Region:
    """The window as rows of the partition ``columns`` (``(dimension, column)``) of ``types``.

    A window that is every combination of its times and values (one key, a range of one
    dimension, a product) is one box; any other set of keys is one box per partition.
    """
    by_dim = dict(columns)
    if not window.is_product():
        return tuple(box for _, box in cells_for(window, columns, types, always=True))
    box: list[Condition] = []
    if window.timed:
        column = by_dim[str(window.time_dimension)]
        spans = tuple(spans_for(window, types[column]))
        box.append(Condition(column, spans=spans))
    for dim, values in window.categories().items():
        column = by_dim[dim]
        box.append(
            Condition(column, values=tuple(category_value(v, types[column]) for v in values))
        )
    return (tuple(box),)


def cells_for(
    window: WriteWindow,
    columns: Sequence[tuple[str, str]],
    types: Mapping[str, pa.DataType],
    always: bool = False,
) -> list[Cell]:
    """Each partition of a range with its box (none for one partition, unless ``always``)."""
    if len(window.partitions) < 2 and not always:
        return []
    by_dim = dict(columns)
    cells: list[Cell] = []
    for p in window.partitions:
        box: list[Condition] = []
        if window.timed and p.start and p.end:
            column = by_dim[str(window.time_dimension)]
            ptype = types[column]
            box.append(
                Condition(column, spans=((bound_for(p.start, ptype), bound_for(p.end, ptype)),))
            )
        for dim, value in p.values:
            column = by_dim[dim]
            box.append(Condition(column, values=(category_value(value, types[column]),)))
        cells.append((p.key, tuple(box)))
    return cells


def category_value(key: str, column_type: pa.DataType) -> object:
    """A static or dynamic partition key as a value of a column of ``column_type``."""
    if pa.types.is_string(column_type) or pa.types.is_large_string(column_type):
        return key
    # Only a key that is the integer's own spelling: "07" and "7" would name the same rows.
    if pa.types.is_integer(column_type) and key.lstrip("-").isdigit() and str(int(key)) == key:
        return int(key)
    raise ConfigurationError(
        f"Refused: partition key {key!r} cannot be compared with its partition column of type"
        f" {column_type}: a category dimension's column must be text (or an integer column"
        " whose keys are integers), so that a key names exactly its own rows. Nothing was"
        " changed. Fix: store the column as text (e.g. df['region'] = df['region'].astype(str))"
        " or use keys that are the column's values."
    )


def _finer_than_a_day(value: datetime) -> str:
    return (
        f"Refused: a partition window starts or ends at {value.isoformat()}, inside a day, but"
        " the partition column is DATE, which tells days apart and not hours. The partitions are"
        " finer than the column's resolution (or start at another hour than midnight), so a"
        " window would hold no row, or the rows of another partition. Nothing was changed. Fix:"
        " make the partition column a TIMESTAMP (the time each row happened), or partition by"
        " whole days from midnight: dg.DailyPartitionsDefinition(start_date=...)."
    )


def _repeated_hour(value: datetime) -> str:
    return (
        f"Refused: a partition window starts or ends at {value.isoformat()} ({value.tzinfo}),"
        " in the hour the clocks repeat when daylight saving time ends, but the partition"
        " column is a naive TIMESTAMP (wall-clock time): a wall-clock value cannot tell the two"
        f" {value:%H:%M} hours apart. Nothing was changed. Fix: store the column as TIMESTAMPTZ"
        " (timezone-aware values, e.g. pandas .dt.tz_localize('UTC') on UTC times), or use UTC"
        " partitions (leave timezone out of the partitions definition)."
    )
