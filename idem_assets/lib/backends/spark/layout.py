"""How a Spark table lays out a window: its partition columns, their specs and directories.

A table is partitioned by its category columns and, for a timestamp time column, by the day of
its rows (:data:`~.sql.DAY`, in UTC for an instant); a ``DATE`` time column partitions by itself.
A window's rows are therefore whole partitions (a daily window) or parts of them (an hourly one):
:func:`covers` tells them apart, so only a partly written partition keeps its other rows.
"""

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

from idem_assets.lib.backends.spark.catalog import Spec
from idem_assets.lib.backends.spark.sql import DAY, day_of, last_day
from idem_assets.lib.model.windows import Box, Region

#: Table properties: the owning asset, a counter every commit raises, the columns in the
#: asset's order (Spark stores partition columns last) and where version directories go.
OWNER = "idem.owner"
VERSION = "idem.version"
COLUMNS = "idem.columns"
ROOT = "idem.root"
#: Each publish writes its partitions under ``<root>/_idem_versions/<uuid>``: a name Spark's
#: file listing skips (a leading ``_`` without ``=``), so no reader of the root sees it.
VERSIONS = "_idem_versions"

#: Characters Spark escapes in a partition directory's name (``ExternalCatalogUtils``).
_ESCAPED = set("\"#%'*/:=?\\\x7f{[]^") | {chr(c) for c in range(1, 32)}


def escape(value: str) -> str:
    """A partition value as Spark writes it into a directory name."""
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in value)


def key_path(column: str, value: object) -> str:
    """The directory segment a category key is stored under (``region=east``)."""
    return f"{escape(column)}={escape(str(value))}"


def spec_text(value: Any) -> str:
    """A partition value as the catalog spells it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, date | datetime):
        return value.isoformat()
    return str(value)


def spec_of(values: Mapping[str, Any]) -> Spec:
    """A partition's spec from its column values."""
    return tuple(sorted((k.lower(), spec_text(v)) for k, v in values.items()))


def directory(version: str, spec: Spec, layout: Sequence[str]) -> str:
    """Where a partition's files go inside a version directory (``.../idem_day=2026-01-02``)."""
    values = dict(spec)
    return version + "".join(f"/{key_path(c, values[c.lower()])}" for c in layout)


def new_layout(
    time_column: str | None, time_is_timestamp: bool, names: Sequence[str]
) -> tuple[str, ...]:
    """The partition columns of a new table: the day (or the date column), then categories."""
    categories = [n for n in names if n != time_column]
    if time_column is None:
        return tuple(categories)
    return (DAY if time_is_timestamp else time_column, *categories)


def _day_range(box: Box, time_column: str | None) -> list[tuple[date, date]] | None:
    for cond in box:
        if cond.column == time_column and cond.spans:
            return [(day_of(lo), last_day(hi)) for lo, hi in cond.spans]
    return None


def _box_meets(box: Box, spec: Mapping[str, str], time_column: str | None, whole: bool) -> bool:
    """Whether ``box`` reaches a partition (``whole``: holds every row it can hold)."""
    for cond in box:
        column = cond.column.lower()
        if cond.column == time_column and cond.spans:
            key = DAY if DAY in spec else column
            if key not in spec:
                return not whole
            day = date.fromisoformat(spec[key])
            spans = [(lo, hi) for lo, hi in cond.spans]
            if whole:
                start = datetime.combine(day, datetime.min.time())
                if not any(_covers_day(lo, hi, day, start) for lo, hi in spans):
                    return False
            elif not any(day_of(lo) <= day <= last_day(hi) for lo, hi in spans):
                return False
        elif cond.values:
            if column not in spec:
                if whole:
                    return False
                continue
            if spec[column] not in {spec_text(v) for v in cond.values}:
                return False
    return True


def _covers_day(lo: Any, hi: Any, day: date, start: datetime) -> bool:
    if not isinstance(lo, datetime):
        return lo <= day < hi
    if lo.tzinfo is not None:
        lo, hi = (day_of(lo), day_of(hi)) if _midnight(lo) and _midnight(hi) else (None, None)
        return lo is not None and lo <= day < hi
    return lo <= start and start + timedelta(days=1) <= hi


def _midnight(value: datetime) -> bool:
    utc = value.astimezone(UTC)
    return (utc.hour, utc.minute, utc.second, utc.microsecond) == (0, 0, 0, 0)


def meets(region: Region, spec: Spec, time_column: str | None) -> bool:
    """Whether a partition may hold rows of ``region``."""
    values = dict(spec)
    return not region or any(_box_meets(b, values, time_column, False) for b in region)


def covers(region: Region, spec: Spec, time_column: str | None) -> bool:
    """Whether every row a partition can hold lies in ``region``."""
    values = dict(spec)
    return not region or any(_box_meets(b, values, time_column, True) for b in region)


def logical_columns(properties: Mapping[str, str], stored: Iterable[str]) -> list[str]:
    """The table's columns in the asset's order, without :data:`DAY`."""
    names = [n for n in stored if n != DAY]
    recorded = properties.get(COLUMNS)
    if recorded:
        order = json.loads(recorded)
        if sorted(c.lower() for c in order) == sorted(c.lower() for c in names):
            by_lower = {n.lower(): n for n in names}
            return [by_lower[c.lower()] for c in order]
    return names
