"""A streamed overwrite of whole days staged as the table's own data file, committed as it is.

delta-rs encodes a batch into Parquet in the commit itself, so a streamed batch staged apart for
the guards was encoded twice: into the staging copy, then by delta-rs. Where the stream has
exactly the table's columns and types (nothing to fit), DuckDB reads it once into a Parquet
file in the table's folder, named by no version of its log, so no reader sees it. The guards
read that file, and the commit adds it (``DeltaTable.create_write_transaction``) in place of
the window's days. A refused or failed publish removes the file; one killed midway leaves a
file the log never names, which a full VACUUM removes (``DeltaTable.vacuum(full=True)``: the
default one only removes files a version once named).

Only a table this library lays out (partitioned by the day alone), on a local file system, with
no writer feature this commit would have to honour (constraints, NOT NULL columns, generated
columns, column mapping, a change data feed) and without writer properties of the IO manager's;
any other publish is staged apart and written by delta-rs, as before.
"""

import json
import math
import os
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction

from idem_assets.lib.backends.delta.errors import plain as plain_error
from idem_assets.lib.backends.delta.layout import DAY_COLUMN, day_span, utc_day
from idem_assets.lib.model.identifiers import quote
from idem_assets.lib.model.settings import WriteSettings
from idem_assets.lib.model.windows import Region
from idem_assets.lib.write.evaluator import embedded_database
from idem_assets.lib.write.seam import CommitConflict, Progress
from idem_assets.lib.write.streams import (
    ParquetCopy,
    SpillArea,
    Spilled,
    Stream,
    copy_to_parquet,
    plain,
    refuse_lost_types,
)

#: Writer features a commit of these files honours: none asks anything of the files.
_FEATURES = frozenset({"timestampNtz"})
#: Table properties under which the commit would owe more than the files (a feed of changes,
#: columns read by id or position), or whose overwrite the guards refuse anyway.
_REFUSING = {
    "delta.enableChangeDataFeed": "true",
    "delta.appendOnly": "true",
}
#: Columns whose statistics Delta readers skip files by, as delta-rs records them.
_DEFAULT_INDEXED = 32


def _time_zone_ok(kind: pa.DataType) -> bool:
    # The day of an instant is its UTC date (layout.with_day); only UTC reads the same here.
    return kind.tz is None or kind.tz in {"UTC", "Etc/UTC", "+00:00", "Z"}  # type: ignore[attr-defined]


def _plain_type(kind: pa.DataType) -> bool:
    """Types DuckDB writes to Parquet exactly as delta-rs does, for every Delta reader."""
    if pa.types.is_timestamp(kind):
        return kind.unit == "us" and _time_zone_ok(kind)  # type: ignore[attr-defined]
    if pa.types.is_floating(kind):
        return not pa.types.is_float16(kind)
    plain_kinds = (
        pa.types.is_signed_integer,
        pa.types.is_boolean,
        pa.types.is_string,
        pa.types.is_large_string,
        pa.types.is_date32,
    )
    return any(test(kind) for test in plain_kinds)


def local_folder(root: str, uri: str) -> Path | None:
    """The table's folder on this machine, ``None`` on object storage."""
    if "://" in root and not root.startswith("file://"):
        return None
    return Path(uri.removeprefix("file://"))


def fits(table: DeltaTable, settings: WriteSettings, schema: pa.Schema) -> bool:
    """Whether a batch of ``schema`` can be added to ``table`` as DuckDB writes it."""
    meta = table.metadata()
    if settings.mode != "overwrite" or list(meta.partition_columns) != [DAY_COLUMN]:
        return False
    protocol = table.protocol()
    features = set(protocol.writer_features or ())
    if protocol.min_writer_version > 2 and protocol.min_writer_version != 7:
        return False
    if protocol.min_writer_version == 7 and not features <= _FEATURES:
        return False
    config = {k: (v or "").lower() for k, v in meta.configuration.items()}
    if any(config.get(k) == v for k, v in _REFUSING.items()) or any(
        k.startswith("delta.constraints.") or k == "delta.dataSkippingStatsColumns" for k in config
    ):
        return False
    if config.get("delta.columnMapping.mode", "none") != "none":
        return False
    schema_now = table.schema()
    if any(not f.nullable or f.metadata for f in schema_now.fields):
        return False
    stored = pa.schema(schema_now.to_arrow())  # type: ignore[arg-type]
    stored = pa.schema([f for f in stored if f.name != DAY_COLUMN])
    batch = plain(schema)
    if stored.names != batch.names or settings.time_column not in batch.names:
        return False
    return all(_plain_type(b.type) and b.type == s.type for b, s in zip(batch, stored, strict=True))


def whole_days(region: Region, time_column: str | None) -> list[date] | None:
    """The days a window of whole days covers, ``None`` unless it is one (of the time alone)."""
    days: list[date] = []
    for box in region:
        if len(box) != 1 or box[0].column != time_column or not box[0].spans:
            return None
        for start, end in box[0].spans:
            if not (_midnight(start) and _midnight(end)):
                return None
            first, stop = day_span(start, end)
            days += [first + timedelta(n) for n in range((stop - first).days)]
    return sorted(set(days)) or None


def _midnight(value: date | datetime) -> bool:
    if not isinstance(value, datetime):
        return True
    at = value.astimezone(UTC) if value.tzinfo else value
    return at.time() == datetime.min.time()


class StagedFiles(Spilled):
    """A streamed batch staged as one Parquet file in its Delta table's folder, outside its log."""

    def __init__(
        self, area: SpillArea, name: str, schema: pa.Schema, copy: ParquetCopy, memory: str
    ) -> None:
        """``copy``'s rows of ``schema``, read through the view ``name`` of ``area``."""
        super().__init__(area, name, schema, copy.rows, memory)
        self.copy = copy
        self.uri = ""
        self.path = Path()
        #: The day every row lies in, ``None`` when they span several (or none): the file is
        #: then only read, and delta-rs writes the rows.
        self.day: date | None = None
        self.created: Path | None = None
        #: The version the first commit that may add the file read, set before it commits:
        #: dropping the file then asks every later version of the log first.
        self.committing: int | None = None
        #: Set once a commit added the file: a version names it, whatever replaces it later.
        self.committed = False

    def add_action(self, folder: Path, indexed: int) -> AddAction:
        """The file as the commit adds it: its day, size and Delta statistics."""
        assert self.day is not None
        stat = self.path.stat()
        stats = delta_statistics(self.copy, self.schema, indexed)
        return AddAction(
            path=self.path.relative_to(folder).as_posix(),
            size=stat.st_size,
            partition_values={DAY_COLUMN: self.day.isoformat()},
            modification_time=int(stat.st_mtime * 1000),
            data_change=True,
            stats=None if stats is None else json.dumps(stats),  # type: ignore[arg-type]
        )

    def drop(self) -> None:
        """Drop the view, and the file unless a commit made it the table's."""
        self._drop_rows()
        if self.committed or (self.committing is not None and self._named_since()):
            # Removed by a later commit or not, a version reads it: VACUUM's to remove.
            return
        self.path.unlink(missing_ok=True)
        if self.created is not None:
            try:
                self.created.rmdir()
            except OSError:
                pass  # Another writer's file of the same day arrived meanwhile.

    def _drop_rows(self) -> None:
        with self.area.cursor() as cursor:
            cursor.execute(f"DROP VIEW IF EXISTS {self.relation}").fetchall()

    def _named_since(self) -> bool:
        """Whether any commit after the version the first try read names the file.

        For a commit that raised after it may have landed (a hook after it, a lost answer).
        """
        assert self.committing is not None
        log = Path(self.uri.removeprefix("file://")) / "_delta_log"
        name = self.path.name
        return any(
            name in entry.read_text()
            for entry in log.glob("*.json")
            if entry.stem.isdigit() and int(entry.stem) > self.committing
        )


def stage_files(
    uri: str,
    folder: Path,
    stream: Stream,
    time_column: str,
    memory: str,
    progress: Progress,
) -> StagedFiles:
    """Read ``stream`` once into a Parquet file in ``folder``, the table's; a view reads it."""
    area = SpillArea(embedded_database(), temporary=False)
    token = uuid.uuid4().hex
    path = folder / f"idem-staged-{token}.parquet"
    try:
        with area.cursor() as cursor:
            copy = copy_to_parquet(stream, cursor, str(path), progress)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    name = f"idem-staged-{token}"
    staged = StagedFiles(area, name, plain(stream.schema), copy, memory)
    staged.uri, staged.path = uri, path
    try:
        staged.day = _one_day(copy, staged.schema.field(time_column).type, time_column)
        if staged.day is not None:
            _move_into_day(staged, folder)
        literal = str(staged.path).replace("'", "''")
        with area.cursor() as cursor:
            cursor.execute(
                f"CREATE VIEW {quote(name)} AS SELECT * FROM read_parquet('{literal}')"
            ).fetchall()
        refuse_lost_types(staged)
    except BaseException:
        staged.drop()
        raise
    progress(
        f"Staged {copy.rows:,} rows in {copy.seconds:.1f} s (DuckDB, {memory}, as a data file"
        " of the Delta table, outside its log until the commit)."
    )
    return staged


def _move_into_day(staged: StagedFiles, folder: Path) -> None:
    """Move the file into its day's folder, where delta-rs keeps that day's files."""
    assert staged.day is not None
    day_folder = folder / f"{DAY_COLUMN}={staged.day.isoformat()}"
    target = day_folder / f"part-idem-{staged.path.stem.removeprefix('idem-staged-')}.parquet"
    for _ in range(_MOVE_TRIES):
        try:
            day_folder.mkdir()
            staged.created = day_folder
        except FileExistsError:
            pass
        try:
            os.replace(staged.path, target)
        except FileNotFoundError:
            # A refused writer of the same day removed the empty folder it had made.
            if not staged.path.exists():
                raise
            continue
        staged.path = target
        return
    raise RuntimeError(
        f"The folder {day_folder} was removed {_MOVE_TRIES} times while a streamed batch moved"
        " into it (other writers of the day, refused, removing the folder they made). Nothing"
        " was committed. Fix: rerun the partition once those writers are done."
    )


#: Moves into a day's folder another writer may remove, empty, at the same time.
_MOVE_TRIES = 10


def _one_day(copy: ParquetCopy, kind: pa.DataType, column: str) -> date | None:
    """The one day every row's time lies in, from the file's statistics; ``None`` otherwise."""
    found = copy.statistics.get(column, {})
    if copy.rows == 0 or found.get("null_count") != "0" or "min" not in found:
        return None
    low, high = (_value(found[k], kind) for k in ("min", "max"))
    days = {utc_day(v) for v in (low, high)}
    return days.pop() if len(days) == 1 else None


def _value(text: str, kind: pa.DataType) -> Any:
    """A statistic DuckDB gives as text, as the Python value of ``kind``."""
    if pa.types.is_timestamp(kind):
        return datetime.fromisoformat(text)
    if pa.types.is_date32(kind):
        return date.fromisoformat(text)
    return int(text)


def delta_statistics(copy: ParquetCopy, schema: pa.Schema, indexed: int) -> dict[str, Any] | None:
    """The file's statistics as delta-rs records them, for the first ``indexed`` columns.

    Every such column's NULL count, and its extremes unless it holds only NULLs: Arrow's view
    of a Delta table turns a missing extreme into a filter no row passes, so a reader that
    filters on that column would skip the file. ``None`` (no statistics: readers read the
    file) where an extreme cannot be given exactly: text DuckDB truncated, NaN or an infinity,
    a date or time ISO 8601 cannot spell.
    """
    lows: dict[str, Any] = {}
    highs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for f in list(schema)[:indexed]:
        found = copy.statistics.get(f.name, {})
        if "null_count" not in found:
            return None
        nulls[f.name] = int(found["null_count"])
        if nulls[f.name] == copy.rows:
            continue
        try:
            extremes = [_extreme(found, k, f.type) for k in ("min", "max")]
        except (KeyError, ValueError, OverflowError):
            return None
        if any(e is None for e in extremes):
            return None
        lows[f.name], highs[f.name] = extremes
    return {"numRecords": copy.rows, "minValues": lows, "maxValues": highs, "nullCount": nulls}


def _extreme(found: dict[str, str], which: str, kind: pa.DataType) -> Any:
    """DuckDB's ``min`` or ``max`` as Delta records it; ``None`` where it is not exact."""
    text = found[which]
    if found.get(f"{which}_is_exact", "true") != "true":
        return None
    if pa.types.is_integer(kind):
        return int(text)
    if pa.types.is_boolean(kind):
        return {"true": True, "false": False}[text]
    if pa.types.is_floating(kind):
        if found.get("has_nan") != "false":
            return None
        value = pa.scalar(float(text), kind).as_py()  # a float32 as the double it is
        return value if math.isfinite(value) else None
    if pa.types.is_date32(kind):
        return date.fromisoformat(text).isoformat()
    if pa.types.is_timestamp(kind):
        return _delta_timestamp(datetime.fromisoformat(text))
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return text
    return None


def _delta_timestamp(value: datetime) -> str:
    """A timestamp statistic as delta-rs writes one: milliseconds, UTC with a ``Z`` if aware."""
    if value.tzinfo is None:
        return value.isoformat(sep=" ", timespec="milliseconds")
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="milliseconds") + "Z"


def indexed_columns(table: DeltaTable) -> int:
    """How many leading columns Delta keeps statistics of for ``table``."""
    configured = table.metadata().configuration.get("delta.dataSkippingNumIndexedCols")
    return _DEFAULT_INDEXED if configured is None else int(configured)


def add(
    table: DeltaTable,
    staged: StagedFiles,
    folder: Path,
    days: Sequence[date],
    properties: Callable[..., Any],
) -> int:
    """Commit the staged file in place of ``days``: one Delta commit; its version.

    delta-rs records such a commit with no predicate, so it would commit beside another
    writer's file added to one of the days meanwhile (a day then held both batches). So it may
    not retry on its own: each try commits exactly on the version it read, and one that lost
    to a commit leaving the days, the schema and the table's settings as they were tries again
    on top of it; any other commit means the guards judged a window that is gone, and the
    publish starts over (:class:`CommitConflict`).
    """
    action = staged.add_action(folder, indexed_columns(table))
    names = [d.isoformat() for d in days]
    if staged.committing is None:
        staged.committing = table.version()
    for _ in range(_COMMIT_TRIES):
        try:
            table.create_write_transaction(
                [action],
                mode="overwrite",
                schema=table.schema(),
                partition_by=[DAY_COLUMN],
                partition_filters=[(DAY_COLUMN, "in", names)],
                commit_properties=properties(max_commit_retries=0),
            )
        except CommitFailedError as exc:
            latest = DeltaTable(table.table_uri)
            if latest.version() == table.version():
                raise  # Not lost to another writer: the backend names the error.
            if _changed(table, latest, names):
                raise CommitConflict(
                    f"another writer committed version {latest.version()} of the table, which"
                    f" changes the days {names} or its schema ({plain_error(exc)})"
                ) from exc
            table = latest
            continue
        staged.committed = True
        return table.version() + 1
    raise CommitConflict(f"{_COMMIT_TRIES} commits of other days landed before this one")


def _kept(table: DeltaTable) -> tuple[Any, ...]:
    """How the table is kept: its id, name (the owner), description, layout and settings."""
    meta = table.metadata()
    return (meta.id, meta.name, meta.description, meta.partition_columns, meta.configuration)


#: Commits of other writers this one may follow, each leaving its days as they were.
_COMMIT_TRIES = 20


def _changed(before: DeltaTable, after: DeltaTable, days: list[str]) -> bool:
    """Whether ``after`` differs from ``before`` in the files of ``days`` or how it is kept."""
    filters = [(DAY_COLUMN, "in", days)]
    return (
        before.schema().to_json() != after.schema().to_json()
        or _kept(before) != _kept(after)
        or before.protocol() != after.protocol()
        or sorted(before.file_uris(filters)) != sorted(after.file_uris(filters))
    )
