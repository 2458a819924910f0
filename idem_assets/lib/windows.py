"""Partition windows: which slice of time one write is responsible for.

Windows are half-open (``start <= t < end``). A run may cover one partition or a contiguous range
of them (a chunked backfill); either way the write is scoped to exactly those partitions.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, time

import dagster as dg
import pyarrow as pa

from idem_assets.lib.errors import ConfigurationError

#: A window boundary as a column compares it: a date for a date column, else a datetime.
Bound = datetime | date


@dataclass(frozen=True)
class PartitionWindow:
    """One partition key and its half-open time window."""

    key: str
    start: datetime
    end: datetime


@dataclass(frozen=True)
class WriteWindow:
    """The partitions one run writes, in time order."""

    partitions: tuple[PartitionWindow, ...]

    def __post_init__(self) -> None:
        if not self.partitions:
            raise ValueError("a WriteWindow needs at least one partition")

    @property
    def start(self) -> datetime:
        """Start of the earliest partition."""
        return self.partitions[0].start

    @property
    def end(self) -> datetime:
        """End of the latest partition."""
        return self.partitions[-1].end

    @property
    def keys(self) -> list[str]:
        """Partition keys in time order."""
        return [p.key for p in self.partitions]

    def spans(self) -> list[tuple[datetime, datetime]]:
        """Contiguous ``(start, end)`` spans covering the partitions (one span for a range)."""
        spans: list[tuple[datetime, datetime]] = []
        for p in self.partitions:
            if spans and spans[-1][1] == p.start:
                spans[-1] = (spans[-1][0], p.end)
            else:
                spans.append((p.start, p.end))
        return spans

    def describe(self) -> str:
        """Human-readable partition list, e.g. ``2026-01-01...2026-01-03 (3 partitions)``."""
        if len(self.partitions) == 1:
            return self.partitions[0].key
        first, last = self.partitions[0].key, self.partitions[-1].key
        return f"{first}...{last} ({len(self.partitions)} partitions)"


def window_from_keys(
    partitions_def: dg.PartitionsDefinition, keys: Sequence[str], asset: str
) -> WriteWindow:
    """Build the window of ``keys`` from a time-window partitions definition."""
    if not isinstance(partitions_def, dg.TimeWindowPartitionsDefinition):
        raise ConfigurationError(
            f"Asset '{asset}' uses {type(partitions_def).__name__}, but idem_assets scopes writes"
            " by time window and supports time-window partitions only (e.g."
            " dg.DailyPartitionsDefinition(start_date=...))."
        )
    parts = []
    for key in dict.fromkeys(keys):
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
        parts.append(PartitionWindow(key=key, start=tw.start, end=tw.end))
    # By instant: datetimes in one zone compare by wall clock, so the two 01:00s would tie.
    parts.sort(key=lambda p: p.start.timestamp())
    return WriteWindow(tuple(parts))


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


def partition_bounds(
    window: WriteWindow, column_type: pa.DataType
) -> list[tuple[str, Bound, Bound]]:
    """Each partition of the window with its bounds in a column of ``column_type``."""
    return [
        (p.key, bound_for(p.start, column_type), bound_for(p.end, column_type))
        for p in window.partitions
    ]


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
