"""Partition windows: which slice of time one write is responsible for.

Windows are half-open (``start <= t < end``). A run may cover one partition or a contiguous range
of them (a chunked backfill); either way the write is scoped to exactly those partitions.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime

import dagster as dg

from idem_assets.lib.errors import ConfigurationError


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
        # still get a window; only a key that its own window spells back is a partition.
        try:
            tw = partitions_def.time_window_for_partition_key(key)
        except ValueError:
            tw = None
        start, end, fmt = partitions_def.start, partitions_def.end, partitions_def.fmt
        if (
            tw is None
            or tw.start.strftime(fmt) != key
            or tw.start < start
            or (end is not None and tw.end > end)
        ):
            span = f"from {start.strftime(fmt)}" + (f" to {end.strftime(fmt)}" if end else "")
            raise ConfigurationError(
                f"Asset '{asset}': partition key {key!r} is not a partition of its"
                f" {type(partitions_def).__name__} (keys formatted {fmt!r}, {span}), so there is"
                " no window to write. Nothing was changed. Fix: pass a key of the definition,"
                f" e.g. {start.strftime(fmt)!r}, or widen the definition (start_date/end_date)."
            )
        parts.append(PartitionWindow(key=key, start=tw.start, end=tw.end))
    parts.sort(key=lambda p: p.start)
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


def bound_for(value: datetime, column_type: str) -> datetime | date:
    """Convert a window boundary to a value comparable with a column of ``column_type``.

    Naive ``TIMESTAMP`` columns hold wall-clock time in the partitions' timezone, so the
    timezone is dropped after conversion rather than shifted to UTC.
    """
    kind = column_type.upper()
    if kind == "DATE":
        return value.date()
    if "WITH TIME ZONE" in kind or kind.startswith("TIMESTAMPTZ"):
        return value
    return value.replace(tzinfo=None)
