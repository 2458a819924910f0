# pyarrow.compute builds its functions at import time, so a type checker cannot see them.
# pyright: reportAttributeAccessIssue=false
"""Refuse run-time values: columns that would hold something different on every rerun.

A rerun must write the same rows, so a column filled at load time (``datetime.now()``, a random
``uuid4()``) breaks the promise even when every guard on keys and windows passes. Decided on the
staged Arrow batch alone, so every engine shares it.

What it sees, and what it cannot:

- A timestamp column stamped while the batch was built: every value within an hour of the
  wall clock, spread over at most a minute, in a window that ended more than an hour ago.
  Naive values are read as UTC, as the machine's local time and as the partitions' time zone,
  so a naive ``datetime.now()`` is caught whatever ``TZ`` is. A source timestamp that spreads
  (corrections made over several minutes) passes; so does one stamp older than an hour (a
  run that computed for longer), one spread over more than a minute (a load stamped page by
  page), and a date (``date.today()``), which cannot be told from a real date.
- A text or binary column of version-1 or version-4 uuids, in canonical form (any one value
  is enough), or as 32 hex digits (``uuid4().hex``: at least four values, and every 32-digit
  value a version-1 or -4 uuid, because a hash of a natural key looks like one in 1 of 32
  values). Other values in the column (``'n/a'``, ``''``) do not hide them. A single
  ``uuid4().hex`` value cannot be told from a hash, and a time or uuid written as other
  text (``str(datetime.now())``) is not looked for.
"""

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, tzinfo

import pyarrow as pa
import pyarrow.compute as pc

from idem_assets.lib.model.errors import RuntimeValueError
from idem_assets.lib.model.settings import WriteSettings
from idem_assets.lib.model.windows import WriteWindow

#: A timestamp column whose every value lies this close to the wall clock, in a window that ended
#: before then, was stamped at load time: a rerun would write different values.
RUNTIME_STAMP_TOLERANCE = timedelta(hours=1)
#: How far apart the values of one load stamp may lie (taken row by row while a batch is built).
RUNTIME_STAMP_SPREAD = timedelta(minutes=1)
#: Clock skew allowed between the machine that stamped and the one that publishes.
_SKEW = timedelta(minutes=5)
#: Bare-hex values needed before a column counts as ``uuid4().hex`` rather than hashes.
_MIN_HEX_UUIDS = 4

_RANDOM_UUID = (
    r"(?i)^(urn:uuid:)?\{?"
    r"[0-9a-f]{8}-[0-9a-f]{4}-[14][0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\}?$"
)
_HEX32 = r"(?i)^[0-9a-f]{32}$"
#: Bare hex, canonical, braced, and urn:uuid: spellings.
#: Lengths of a UUID's text forms; an int tuple, as an Arrow array built at import would
#: make pyarrow import pandas with the library.
_UUID_LENGTHS = (32, 36, 38, 45)
_RANDOM_HEX = r"(?i)^[0-9a-f]{12}[14][0-9a-f]{3}[89ab][0-9a-f]{15}$"


def check_runtime_values(
    batch: pa.Table, settings: WriteSettings, window: WriteWindow | None, now: datetime
) -> None:
    """Raise :class:`RuntimeValueError` when a column of ``batch`` holds run-time values."""
    allowed = set(settings.allow_runtime_columns)
    where = f"asset '{settings.asset}'" + (f", partition {window.describe()}" if window else "")
    # Without a time dimension nothing dates the data, as for an unpartitioned asset.
    window_ended = (
        window is None
        or not window.timed
        or window.end.astimezone(UTC) <= now - RUNTIME_STAMP_TOLERANCE
    )
    for name, column in zip(batch.column_names, batch.columns, strict=True):
        if name in allowed:
            continue
        if window_ended and pa.types.is_timestamp(column.type):
            stamp = _load_stamp(column, _zones(window), now)
            if stamp is not None:
                lo, hi = stamp
                raise RuntimeValueError(
                    f"Refused to write {where}: every value of '{name}' ({lo} to {hi}) is the"
                    f" time of this run ({now.astimezone(UTC):%Y-%m-%d %H:%M} UTC), not a fact of"
                    " the data." + _fix(name)
                )
        example = _random_uuid(column)
        if example is not None:
            raise RuntimeValueError(
                f"Refused to write {where}: column '{name}' holds random or time-based uuids"
                f" (version 1 or 4, e.g. {example!r}), which are new on every run." + _fix(name)
            )


def _fix(column: str) -> str:
    return (
        " A rerun would write different values, so the partition would never be the same twice."
        " Nothing was changed. Fix: derive the value from the input (e.g. the source's"
        " updated_at, or uuid5 of the row's natural key), or keep run facts in Dagster's run"
        " metadata; if the column really must hold a run-time value, declare it:"
        f" metadata={{'allow_runtime_columns': ['{column}']}}."
    )


def _zones(window: WriteWindow | None) -> list[tzinfo]:
    """Zones a naive timestamp may have been taken in: UTC, this machine's, the partitions'."""
    zones: list[tzinfo] = [UTC]
    local = datetime.now().astimezone().tzinfo
    if local is not None:
        zones.append(local)
    if window is not None and window.timed and window.end.tzinfo is not None:
        zones.append(window.end.tzinfo)
    return zones


def _load_stamp(
    column: pa.ChunkedArray, zones: Sequence[tzinfo], now: datetime
) -> tuple[datetime, datetime] | None:
    """``(min, max)`` of a column that looks stamped at load time, else ``None``."""
    bounds = pc.min_max(column).as_py()
    lo, hi = bounds["min"], bounds["max"]
    if lo is None or hi - lo > RUNTIME_STAMP_SPREAD:
        return None
    if lo.tzinfo is not None:
        candidates = [now]
    else:
        # The same instant as wall-clock time in each zone it may have been read in.
        candidates = [now.astimezone(z).replace(tzinfo=None) for z in zones]
    for wall_now in candidates:
        if lo >= wall_now - RUNTIME_STAMP_TOLERANCE and hi <= wall_now + _SKEW:
            return lo, hi
    return None


def _random_uuid(column: pa.ChunkedArray) -> str | None:
    """A version-1 or -4 uuid the column holds (as text or 16 bytes), else ``None``."""
    kind = column.type
    if isinstance(kind, pa.ExtensionType):
        column, kind = column.cast(kind.storage_type), kind.storage_type
    if pa.types.is_fixed_size_binary(kind) and kind.byte_width == 16:
        return _random_uuid_bytes(column)
    if pa.types.is_dictionary(kind):
        column = column.cast(kind.value_type)
        kind = kind.value_type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        return None
    # Only values as long as a uuid can be one; the length test spares the regex most columns.
    column = column.filter(pc.is_in(pc.binary_length(column), pa.array(_UUID_LENGTHS, pa.int32())))
    if not len(column):
        return None
    canonical = column.filter(pc.match_substring_regex(column, _RANDOM_UUID))
    if len(canonical):
        return canonical[0].as_py()
    hex32 = column.filter(pc.match_substring_regex(column, _HEX32))
    if len(hex32) < _MIN_HEX_UUIDS:
        return None
    if pc.all(pc.match_substring_regex(hex32, _RANDOM_HEX)).as_py():
        return hex32[0].as_py()
    return None


def _random_uuid_bytes(column: pa.ChunkedArray) -> str | None:
    for value in column.to_pylist():
        if value is not None and value[6] >> 4 in (1, 4) and value[8] >> 6 == 0b10:
            return value.hex()
    return None
