"""The Delta Lake backend: one Delta commit per publish, decided by the engine-neutral guards.

A Delta table has no multi-statement transaction: a write is one optimistic commit to its log.
So the publish reads one snapshot of the table, fits the batch to it on Arrow types
(:mod:`idem_assets.lib.write.schema_fit`, Delta's types in :mod:`.delta_types`), the guards judge the
staged batch against it in an embedded DuckDB (the batch and the window read from Delta
registered as Arrow), and the write
itself is held back until the transaction ends, where it becomes exactly one commit: a predicate
overwrite of the window (per box of its region: ``>= start AND < end`` per span and
``column IN (...)`` per category, typed literals), or one ``DeltaTable.merge`` scoped the same
way. A crash at any stage before that commit leaves the table at its old
version. A commit that loses to a concurrent writer of the same files raises
:class:`~idem_assets.lib.backends.protocol.CommitConflict`, and the publish starts over on the
new version.

Layout: ``<root>/<schema>/<table>``, partitioned by a derived day column (:data:`DAY_COLUMN`,
the time column's date, in UTC for time-zone-aware columns) when the partitions have a time
dimension, then by each category (static or dynamic) dimension's own column
(:func:`delta_partitions`), so writers of different partitions touch different files and both
commit. The day column is the library's own: it never reaches a fingerprint, the schema checks
or ``load_input``; a table another tool made has none, and is written in its own layout. The
owning asset is the table's name in its Delta metadata (:data:`OWNER_PREFIX` and the asset
key), set by the commit that creates the table and read with the snapshot before any write;
delta-rs names a table in no other commit that writes rows, so a table nobody owns is handed
over by its user first (:meth:`DeltaBackend.handover_text`).
"""

import os
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError, TableNotFoundError

from idem_assets.lib.backends.delta.errors import denied, log_damage, lost_commit, refused_rows
from idem_assets.lib.backends.delta.types import DeltaTypes
from idem_assets.lib.backends.duckdb import sql
from idem_assets.lib.model.errors import SchemaMismatchError
from idem_assets.lib.model.identifiers import quote, validate_identifier
from idem_assets.lib.model.samples import sample_text
from idem_assets.lib.model.settings import WriteSettings, spelt_partitions
from idem_assets.lib.model.windows import (
    Bound,
    Box,
    Condition,
    Region,
    WriteWindow,
    region_of,
)
from idem_assets.lib.sql import statements as batch_sql
from idem_assets.lib.write.schema_fit import (
    SchemaChange,
    evolved,
    fit_columns,
    refuse_lossy_values,
    schema_changes,
    stored_batch,
)
from idem_assets.lib.write.seam import (
    CommitConflict,
    Counts,
    PartitionColumns,
    Scope,
    Staged,
    Target,
)

#: The derived partition column; not a plain identifier, so no user column can be called so.
DAY_COLUMN = "idem-day"
#: The table's name (Delta metadata) is this prefix and the asset key of the table's owner.
OWNER_PREFIX = "idem_assets:"
_TARGET_PREFIX = "idem-target-"
_PRUNABLE_KEY_TYPES = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "VARCHAR", "DATE"}
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


def _day(value: Bound) -> date:
    if isinstance(value, datetime):
        return (value.astimezone(UTC) if value.tzinfo else value).date()
    return value


def day_span(start: Bound, end: Bound) -> tuple[date, date]:
    """The half-open range of :data:`DAY_COLUMN` values a span's rows can have."""
    last = end - timedelta(microseconds=1) if isinstance(end, datetime) else end - timedelta(1)
    return _day(start), _day(last) + timedelta(days=1)


def window_predicate(
    column: str,
    column_type: pa.DataType,
    spans: Sequence[tuple[Bound, Bound]],
    alias: str | None = None,
    partitioned: bool = True,
) -> str:
    """The window as a Delta predicate: per span, its days and ``>= start AND < end``.

    The day conjuncts follow from the others; they let Delta prune files by partition and tell
    a concurrent writer of another day apart from one of the same day.
    """
    prefix = f"{alias}." if alias else ""
    c = f"{prefix}`{validate_identifier(column, 'partition column')}`"
    day = f"{prefix}`{DAY_COLUMN}`"
    parts = []
    for start, end in spans:
        conjuncts = [f"{c} >= {literal(start, column_type)}", f"{c} < {literal(end, column_type)}"]
        if partitioned:
            lo, hi = day_span(start, end)
            conjuncts = [
                f"{day} >= {literal(lo, pa.date32())}",
                f"{day} < {literal(hi, pa.date32())}",
                *conjuncts,
            ]
        parts.append("(" + " AND ".join(conjuncts) + ")")
    return "(" + " OR ".join(parts) + ")"


def region_predicate(
    region: Region,
    types: Mapping[str, pa.DataType],
    alias: str | None = None,
    partitioned: bool = True,
) -> str:
    """The region as a Delta predicate: any of its boxes (see :func:`box_predicate`)."""
    return "(" + " OR ".join(box_predicate(box, types, alias, partitioned) for box in region) + ")"


def box_predicate(
    box: Box, types: Mapping[str, pa.DataType], alias: str | None = None, partitioned: bool = True
) -> str:
    """Rows meeting every condition: the time spans (:func:`window_predicate`), ``IN`` lists."""
    prefix = f"{alias}." if alias else ""
    conjuncts = []
    for cond in box:
        if cond.spans:
            conjuncts.append(
                window_predicate(cond.column, types[cond.column], cond.spans, alias, partitioned)
            )
        else:
            c = f"{prefix}`{validate_identifier(cond.column, 'partition column')}`"
            values = ", ".join(category_literal(v) for v in cond.values)
            conjuncts.append(f"{c} IN ({values})")
    return "(" + " AND ".join(conjuncts) + ")"


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


def delta_partitions(settings: WriteSettings, batch: pa.Table) -> list[str]:
    """The partition columns a new table gets: the derived day, then each category column.

    A category dimension's column is a Delta partition column itself: its values are the
    partition keys, so each key's rows sit in files of their own (as many directories as Dagster
    has partitions). An overwrite of one key then drops only its files, a read of one key opens
    only them, and writers of different keys commit side by side, as writers of different days
    do. A time column is never one (a directory per instant): its day is. Without any
    partition dimension the table is not partitioned.
    """
    day = [DAY_COLUMN] if DAY_COLUMN in batch.column_names else []
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


@dataclass
class _Snapshot:
    """The table as one publish read it: every read and the commit use this version."""

    uri: str
    table: DeltaTable | None
    #: Columns as stored, without :data:`DAY_COLUMN`.
    schema: pa.Schema | None
    #: The table's Delta partition columns (:data:`DAY_COLUMN` and category columns).
    partition_by: tuple[str, ...]

    @property
    def partitioned(self) -> bool:
        """Whether the table is partitioned by the derived day."""
        return DAY_COLUMN in self.partition_by


class DeltaBackend:
    """Publishes to Delta tables under ``root``; call :meth:`close` (or use ``with``) after."""

    engine = "Delta Lake"

    def __init__(self, root: str, storage_options: dict[str, str] | None = None) -> None:
        """Tables live at ``<root>/<schema>/<table>``; ``storage_options`` reach object storage."""
        self.root = root
        self.storage_options = storage_options or None
        #: A local file system's limit on a file name; object stores take far longer keys.
        self.name_limit = 255 if "://" not in root or root.startswith("file://") else None
        #: The version the last publish committed, and its table (``None`` before one did).
        self.version: int | None = None
        self.committed_uri: str | None = None
        self._conn: duckdb.DuckDBPyConnection | None = None
        #: "asset 'x', partition D" of the publish in progress, for messages.
        self._where: str | None = None
        self._names: list[str] = []
        self._views: list[str] = []
        self._snapshot: _Snapshot | None = None
        self._pending: Callable[[], None] | None = None
        self._write_batch: pa.Table | None = None
        self._written: pa.Table | None = None
        #: Whether the pending commit adds the batch's new columns (schema_evolution).
        self._adds_columns = False

    def __enter__(self) -> "DeltaBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Drop what this backend registered in the embedded DuckDB, and close its cursor."""
        if self._conn is None:
            return
        try:
            for view in self._views:
                self._conn.execute(f"DROP VIEW IF EXISTS {view}")
            for name in self._names:
                self._conn.unregister(name)
        finally:
            self._conn.close()
            self._conn, self._names, self._views = None, [], []

    def _db(self) -> duckdb.DuckDBPyConnection:
        if self._conn is None:
            self._conn = _evaluator().cursor()
        return self._conn

    def _put(self, name: str, data: object) -> str:
        """Register Arrow ``data`` in the evaluator under ``name``; returns it quoted."""
        self._db().register(name, data)
        self._names.append(name)
        return quote(name)

    def uri(self, schema: str, table: str) -> str:
        """Where ``schema.table`` lives."""
        return table_uri(self.root, schema, table)

    def _open(self, uri: str, where: str | None = None) -> DeltaTable | None:
        """The table's latest version, ``None`` without one; a log it cannot read is named."""
        try:
            return DeltaTable(uri, storage_options=self.storage_options)
        except TableNotFoundError:
            return None
        except DeltaError as exc:
            target = ".".join(uri.rsplit("/", 2)[-2:])
            damaged = log_damage(exc, where, uri, target)
            if damaged is None:
                raise
            raise damaged from exc

    @contextmanager
    def transaction(self, where: str) -> Iterator[None]:
        """A fresh evaluator for the guards; the one Delta commit when the body returns."""
        self.close()
        self._where = where
        try:
            yield
            if self._pending is not None:
                self._pending()
        except (DeltaError, OSError) as exc:
            lost = lost_commit(exc)
            if lost is not None:
                raise CommitConflict(lost) from exc
            explained = self._explained(exc, where)
            if explained is None:
                raise
            raise explained from exc
        finally:
            self._where = None
            self._pending, self._snapshot = None, None
            self._write_batch, self._written = None, None
            self._adds_columns = False
            self.close()

    def _explained(self, exc: BaseException, where: str) -> Exception | None:
        """A library error naming what delta-rs failed on and its fix, if it is one it knows."""
        snap = self._snapshot
        if snap is None or snap.table is None:
            return denied(exc, where, self.root)
        target = snap.uri.rsplit("/", 2)
        table = snap.table
        checks = {
            name.removeprefix("delta.constraints."): expression
            for name, expression in table.metadata().configuration.items()
            if name.startswith("delta.constraints.") and expression is not None
        }
        fields = pa.schema(table.schema().to_arrow())  # type: ignore[arg-type]
        not_null = [f.name for f in fields if not f.nullable]
        return (
            refused_rows(exc, where, snap.uri, checks, not_null)
            or log_damage(exc, where, snap.uri, f"{target[-2]}.{target[-1]}")
            or denied(exc, where, self.root)
        )

    def evaluator(self) -> duckdb.DuckDBPyConnection:
        """The embedded DuckDB: the staged batch and the window's rows are registered in it."""
        return self._db()

    def describe(self, settings: WriteSettings) -> Target:
        """Open the table's latest version: every later read and the commit use it."""
        uri = self.uri(settings.schema, settings.table)
        table = self._open(uri, self._where)
        schema, owner, partition_by, append_only = None, None, (), False
        if table is not None:
            full = pa.schema(table.schema().to_arrow())  # type: ignore[arg-type]
            partition_by = tuple(table.metadata().partition_columns)
            schema = pa.schema([f for f in full if f.name != DAY_COLUMN])
            owner = owner_of(table)
            config = table.metadata().configuration
            append_only = config.get("delta.appendOnly", "false").lower() == "true"
        self._snapshot = _Snapshot(uri, table, schema, partition_by)
        # Only the commit that creates a table can name its owner with its rows (delta-rs
        # commits no name with a write): a table nobody owns is handed over first.
        return Target(
            exists=table is not None,
            owner=owner,
            claimable=table is None,
            append_only=append_only,
        )

    def stage(self, batch: pa.Table, settings: WriteSettings, where: str) -> Staged:
        """Fit the batch to the table (schema_fit), cast it in Arrow, register it for the guards."""
        snap = self._current()
        table = {f.name: f.type for f in snap.schema} if snap.schema is not None else None
        types = DeltaTypes(snap.uri)
        changes = schema_changes(settings, where, batch.schema, table, types)
        if table is not None and changes:
            _refuse_widening(settings, where, changes, table, types)
            table = evolved(table, changes)
        fits = fit_columns(settings, where, batch.schema, table, types)
        refuse_lossy_values(batch, fits, settings, where, types)
        unchanged = all(f.name == f.stored_name and f.type == f.stored_type for f in fits)
        # Timestamps are floored to microseconds: a floor never moves a row across a window
        # bound, so the guards judge exactly the rows Delta stores.
        stored = batch if unchanged else stored_batch(batch, fits)
        self._write_batch = stored
        relation = self._put(_TARGET_PREFIX + uuid.uuid4().hex, stored)
        spelt = {f.name.lower(): f.stored_name for f in fits}
        spelt_settings = replace(
            spelt_partitions(settings, spelt),
            primary_key=tuple(spelt[k.lower()] for k in settings.primary_key),
            dedupe_order_by=tuple(spelt[k.lower()] for k in settings.dedupe_order_by),
        )
        types = {f.stored_name: f.stored_type for f in fits}
        return Staged(
            relation=relation,
            settings=spelt_settings,
            partition_types={c: types[c] for c in spelt_settings.partition_names},
            changes=tuple(changes),
        )

    def evolve(self, settings: WriteSettings, changes: Sequence[SchemaChange]) -> None:
        """Add the new columns in the held-back commit itself (Delta's schema merge)."""
        # Widening was refused in stage(): only added columns reach here.
        self._adds_columns = any(c.action == "add_column" for c in changes)

    def _current(self) -> _Snapshot:
        if self._snapshot is None:
            raise RuntimeError("describe() opens the table's snapshot before anything reads it")
        return self._snapshot

    def refuse_rounded_out(self, scope: Scope, rows: int) -> None:
        """Nothing to refuse: staging floors to the stored unit, which keeps rows in the window."""

    def column_types(self, settings: WriteSettings) -> dict[str, pa.DataType] | None:
        """The table's columns as Arrow types (without the derived day), or ``None``."""
        table = self._open(self.uri(settings.schema, settings.table))
        if table is None:
            return None
        schema = pa.schema(table.schema().to_arrow())  # type: ignore[arg-type]
        return {f.name: f.type for f in schema if f.name != DAY_COLUMN}

    def _register(
        self,
        table: DeltaTable,
        partition_by: Sequence[str],
        region: Region,
        pruning: list[list[tuple[str, str, Any]]] | None = None,
    ) -> str:
        """Register ``table`` (only the files the region's partitions can be in) for reads."""
        if region:
            pruning = region_filter(region, partition_by)
        dataset = table.to_pyarrow_dataset(file_pruning_predicate=pruning)  # type: ignore[arg-type]
        return self._put(_TARGET_PREFIX + uuid.uuid4().hex, dataset)

    def _target(self, scope: Scope, whole: bool = False) -> str:
        snap = self._current()
        assert snap.table is not None
        return self._register(snap.table, snap.partition_by, () if whole else scope.region)

    def _files(self) -> pa.Table:
        """The snapshot's data files with their row counts and column statistics."""
        snap = self._current()
        assert snap.table is not None
        return pa.table(snap.table.get_add_actions(flatten=True))  # type: ignore[arg-type]

    def _counted_from_statistics(self, scope: Scope) -> Counts | None:
        """The window's row counts from the files' statistics, or ``None`` if a scan must tell.

        A file whose rows all lie inside one partition of the window counts whole, one whose
        rows all lie outside it counts nothing; any other file needs its rows read.
        """
        files = self._files()
        if not scope.region or "num_records" not in files.column_names:
            return None
        parts: list[tuple[str | None, Box]] = list(scope.cells) or [
            (None, box) for box in scope.region
        ]
        wanted = {f"{kind}.{c}" for c in scope.pcols for kind in ("min", "max", "partition")}
        stats = {n: files.column(n).to_pylist() for n in files.column_names if n in wanted}
        counts: Counts = {}
        for i, n in enumerate(files.column("num_records").to_pylist()):
            if n is None:
                return None
            placed = [(k, _file_in_box(stats, i, box)) for k, box in parts]
            inside = [k for k, verdict in placed if verdict is True]
            if inside:
                counts[inside[0]] = counts.get(inside[0], 0) + n
            elif any(verdict is None for _, verdict in placed):
                return None
        if not scope.cells:
            return {None: counts.get(None, 0)}
        return counts

    def _key_pruning(self, scope: Scope) -> list[list[tuple[str, str, Any]]] | None:
        """Files whose key statistics may hold a key of the batch: the batch's key ranges."""
        conn, source = self._db(), scope.staged.relation
        types = {r[0]: r[1] for r in conn.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
        # Integers, text and dates compare in file statistics exactly as in the batch.
        usable = [k for k in scope.key if types.get(k) in _PRUNABLE_KEY_TYPES]
        if not usable:
            return None
        ranges = ", ".join(f"min({quote(k)}), max({quote(k)})" for k in usable)
        found = conn.execute(f"SELECT {ranges} FROM {source}").fetchall()[0]
        if any(v is None for v in found):
            return None
        conjunction: list[tuple[str, str, Any]] = []
        for i, k in enumerate(usable):
            conjunction += [(k, ">=", found[2 * i]), (k, "<=", found[2 * i + 1])]
        return [conjunction]

    def count_window(self, scope: Scope) -> Counts:
        """Rows the window holds in the snapshot: per partition of a range."""
        if not scope.table_exists:
            return {}
        counted = self._counted_from_statistics(scope)
        if counted is not None:
            return counted
        target, conn = self._target(scope), self._db()
        if scope.cells:
            q, p = sql.count_by_partition(target, scope.cells)
            return dict(conn.execute(q, p).fetchall())
        q, p = sql.count_window(target, scope.region)
        return {None: conn.execute(q, p).fetchall()[0][0]}

    def count_keys(self, scope: Scope) -> tuple[Counts, int]:
        """For a merge, the window's rows whose key the batch holds, and those elsewhere."""
        if scope.settings.mode != "merge" or not scope.table_exists:
            return {}, 0
        conn, key = self._db(), scope.key
        snap = self._current()
        assert snap.table is not None
        target = self._register(snap.table, snap.partition_by, (), self._key_pruning(scope))
        source = scope.staged.relation
        if scope.cells:
            q, p = sql.matched_by_partition(target, source, key, scope.cells)
            matched: Counts = dict(conn.execute(q, p).fetchall())
            return matched, matched.pop(None, 0)
        q, p = sql.merge_counts(target, source, key, scope.region)
        in_window, outside_keys = conn.execute(q, p).fetchall()[0]
        return {None: in_window}, outside_keys

    def keys_elsewhere_sample(self, scope: Scope) -> str:
        """A few rows outside the window whose key the batch holds."""
        q, p = sql.keys_outside_window_sample(
            self._target(scope, whole=True),
            scope.staged.relation,
            scope.key,
            scope.region,
        )
        return sample_text(self._db(), q, p)

    def claim(self, settings: WriteSettings) -> None:
        """Nothing yet: the commit that creates the table names its owner (:meth:`_create`)."""

    def owners_text(self) -> str:
        """Where the owner is recorded."""
        return f"the table's name ('{OWNER_PREFIX}<asset key>')"

    def handover_text(self, settings: WriteSettings) -> str:
        """Code that hands ``settings.table`` over to ``settings.asset``."""
        uri = self.uri(settings.schema, settings.table)
        name = OWNER_PREFIX + settings.asset
        return f"deltalake.DeltaTable({uri!r}).alter.set_table_name({name!r})"

    def lift_append_only_text(self, settings: WriteSettings) -> str:
        """Code that lets ``settings.table`` take commits that remove files."""
        uri = self.uri(settings.schema, settings.table)
        return (
            f"deltalake.DeltaTable({uri!r}).alter.set_table_properties("
            "{'delta.appendOnly': 'false'})"
        )

    def key_paths(self, scope: Scope) -> dict[tuple[str, object], str]:
        """The directory each category key of the window gets: ``column=<key, %-encoded>``."""
        snap = self._current()
        if snap.table is not None:
            partition_by = set(snap.partition_by)
        else:
            partition_by = set(delta_partitions(scope.settings, pa.table({})))
        return {
            (cond.column, value): f"{cond.column}={quote_key(value)}"
            for box in scope.region
            for cond in box
            if cond.column in partition_by
            for value in cond.values
        }

    def _stored(self, batch: pa.Table, settings: WriteSettings) -> pa.Table:
        """``batch`` in the table's layout: with :data:`DAY_COLUMN` where the table has one."""
        snap = self._current()
        # A table another tool made keeps its own layout: its files are never given the day.
        day_from = settings.time_column if snap.table is None or snap.partitioned else None
        return with_day(batch, day_from)

    def _predicate(self, scope: Scope, alias: str | None = None) -> str | None:
        """The window as a Delta predicate, ``None`` without one (the whole table)."""
        if not scope.region:
            return None
        partitioned = self._current().partitioned
        return region_predicate(scope.region, scope.staged.partition_types, alias, partitioned)

    def replace(self, scope: Scope, on_stage: Callable[[str], None]) -> int:
        """Hold back one predicate overwrite of the window (the whole table when unpartitioned)."""
        assert self._write_batch is not None
        batch = self._write_batch
        on_stage("deleted")
        self._written = self._stored(batch, scope.settings)
        self._pending = self._overwrite(scope, self._written)
        return batch.num_rows

    def _overwrite(self, scope: Scope, data: pa.Table) -> Callable[[], None]:
        """The commit that replaces the window with ``data`` (or creates the table with it)."""
        snap = self._current()
        predicate = self._predicate(scope)

        def commit() -> None:
            if snap.table is None:
                self._create(scope, snap, data)
                return
            write_deltalake(
                snap.table,
                data,
                mode="overwrite",
                predicate=predicate,
                schema_mode="merge" if self._adds_columns else None,
            )
            self.version, self.committed_uri = snap.table.version(), snap.uri

        return commit

    def merge(self, scope: Scope, on_stage: Callable[[str], None]) -> int:
        """Hold back one ``DeltaTable.merge``: update matched, insert new, delete in the window."""
        settings = scope.settings
        assert self._write_batch is not None
        batch = self._write_batch
        if settings.dedupe_order_by:
            columns = list(batch.column_names)
            order_by = settings.dedupe_order_by
            q = batch_sql.dedupe(scope.staged.relation, scope.key, order_by, columns)
            batch = self._db().sql(q).to_arrow_table()
        snap = self._current()
        on_stage("deleted")
        data = self._stored(batch, settings)
        self._written = data
        if snap.table is None:
            self._pending = self._overwrite(scope, data)
            return data.num_rows
        if self._adds_columns:
            # delta-rs's schema-merging MERGE commits the table's metadata without its name,
            # which records the owner: the window as the merge leaves it is written instead,
            # as the window's overwrite (one commit, the name kept).
            merged = self._db().sql(f"SELECT * FROM {self._after(scope, batch.column_names)}")
            self._pending = self._overwrite(scope, self._stored(merged.to_arrow_table(), settings))
            return data.num_rows
        window = self._predicate(scope, "t")
        on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in scope.key)
        if window:
            # Scoped to the window: Delta reads and rewrites only its days' files.
            on += f" AND {window}"
        table = snap.table

        def commit() -> None:
            merger = (
                table.merge(data, on, source_alias="s", target_alias="t")
                .when_matched_update_all()
                .when_not_matched_insert_all()
            )
            if settings.delete_missing:
                merger = merger.when_not_matched_by_source_delete(window)
            merger.execute()
            self.version, self.committed_uri = table.version(), snap.uri

        self._pending = commit
        return data.num_rows

    def _create(self, scope: Scope, snap: _Snapshot, data: pa.Table) -> None:
        """Create the table holding the batch, named after its owner: one commit, version 0.

        The publish decided on no table, so only version 0 may hold its batch. ``mode='error'``
        refuses a table another writer created before this one opened it; without a retry,
        delta-rs cannot rebase the creation onto a table created while this one wrote (it would
        commit version 1, the batch beside the other's). Either way the publish starts over on
        that writer's table and decides again.
        """
        write_deltalake(
            snap.uri,
            data,
            mode="error",
            partition_by=delta_partitions(scope.settings, data) or None,
            name=OWNER_PREFIX + scope.settings.asset,
            storage_options=self.storage_options,
            commit_properties=CommitProperties(max_commit_retries=0),
        )
        self.version, self.committed_uri = 0, snap.uri

    def fingerprints(self, scope: Scope) -> dict[str | None, tuple[int, int]]:
        """Count and hash sum of the window as the held-back commit leaves it.

        Computed from the staged batch (and, for a merge, the snapshot's window rows the batch
        keeps), with the same row hash :meth:`fingerprint_table` applies to the stored rows: a
        function of the rows alone, whatever files hold them.
        """
        conn = self._db()
        assert self._written is not None
        columns = [c for c in self._written.column_names if c != DAY_COLUMN]
        new = self._after(scope, columns)
        if scope.cells:
            q, p = sql.partition_fingerprints(new, columns, scope.cells)
            return {k: (n, d) for k, n, d in conn.execute(q, p).fetchall()}
        q, p = sql.fingerprint(new, columns, scope.region)
        count, digest = conn.execute(q, p).fetchall()[0]
        return {None: (count, digest)}

    def _after(self, scope: Scope, columns: list[str]) -> str:
        """A relation holding the window as the pending commit leaves it."""
        conn = self._db()
        written = self._put(_TARGET_PREFIX + uuid.uuid4().hex, self._written)
        cols = ", ".join(quote(c) for c in columns)
        relation = f"SELECT {cols} FROM {written}"
        settings = scope.settings
        if settings.mode == "merge" and scope.table_exists and not settings.delete_missing:
            # An upsert keeps the window's rows whose key the batch does not hold.
            on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in scope.key)
            # A column this publish adds holds NULL in the rows it keeps.
            before = self._current().schema
            stored = set(before.names) if before is not None else set()
            kept = ", ".join(
                f"t.{quote(c)}" if c in stored else f"NULL AS {quote(c)}" for c in columns
            )
            relation += (
                f" UNION ALL SELECT {kept} FROM {self._target(scope)} t"
                f" ANTI JOIN {written} s ON {on}"
            )
        name = quote(_TARGET_PREFIX + uuid.uuid4().hex)
        conn.execute(f"CREATE TEMP VIEW {name} AS {relation}")
        self._views.append(name)
        return name

    def fingerprint_table(
        self,
        schema: str,
        table: str,
        partition_columns: PartitionColumns,
        window: WriteWindow | None,
    ) -> tuple[int, int] | None:
        """Count and hash sum of a table (or one window of it); ``None`` when it is absent."""
        found = self._open(self.uri(schema, table))
        if found is None:
            return None
        full = pa.schema(found.schema().to_arrow())  # type: ignore[arg-type]
        columns = [f.name for f in full if f.name != DAY_COLUMN]
        region = region_of(window, partition_columns, _field_type(full), f"{schema}.{table}")
        partition_by = found.metadata().partition_columns
        target = self._register(found, partition_by, region)
        q, p = sql.fingerprint(target, columns, region)
        count, digest = self._db().execute(q, p).fetchall()[0]
        return count, digest

    def load(
        self, settings: WriteSettings, window: WriteWindow | None, nothing: bool, arrow: bool
    ) -> pa.Table | pd.DataFrame:
        """The window's rows (the whole table without one), in partition order."""
        found = self._open(self.uri(settings.schema, settings.table))
        if found is None:
            raise RuntimeError(f"no Delta table {settings.schema}.{settings.table}")
        full = pa.schema(found.schema().to_arrow())  # type: ignore[arg-type]
        pcols = settings.partition_names
        region = region_of(
            window,
            settings.partition_columns,
            _field_type(full),
            f"{settings.schema}.{settings.table}",
        )
        target = self._register(found, found.metadata().partition_columns, region)
        columns = ", ".join(quote(f.name) for f in full if f.name != DAY_COLUMN)
        where, params, order = "", [], ""
        if pcols:
            order = " ORDER BY " + ", ".join(quote(c) for c in pcols)
        if nothing:
            where = " WHERE false"
        elif region:
            pred, params = batch_sql.region_predicate(region)
            where = f" WHERE {pred}"
        relation = self._db().sql(f"SELECT {columns} FROM {target}{where}{order}", params=params)
        return relation.to_arrow_table() if arrow else relation.df()


def quote_key(value: object) -> str:
    """A partition value as delta-rs writes it in a path: every byte but A-Z a-z 0-9 -._~ as %XX."""
    # delta-rs percent-encodes the controls and every ASCII punctuation but -._~, and UTF-8.
    return urllib.parse.quote(str(value), safe="")


def _file_in_box(stats: Mapping[str, list[Any]], i: int, box: Box) -> bool | None:
    """Whether every row of file ``i`` is in ``box`` (True), none is (False), or it is unknown.

    ``stats`` holds the files' partition values and statistics by column (``min.<column>``).
    """
    verdicts = [_file_meets(stats, i, cond) for cond in box]
    if any(v is False for v in verdicts):
        return False
    return True if all(v is True for v in verdicts) else None


def _file_meets(stats: Mapping[str, list[Any]], i: int, cond: Condition) -> bool | None:
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


def _refuse_widening(
    settings: WriteSettings,
    where: str,
    changes: Sequence[SchemaChange],
    table: dict[str, pa.DataType],
    types: DeltaTypes,
) -> None:
    """Refuse a type the asset opted to widen: delta-rs cannot change a column's type in a write."""
    widened = [c for c in changes if c.action == "widen_type"]
    if not widened:
        return
    listed = "; ".join(f"{c.column}: table {table[c.column]}, batch {c.type}" for c in widened)
    keeps = "'add_columns'" if settings.adds_columns else "'strict'"
    raise SchemaMismatchError(
        f"Refused to write {where}: schema_evolution asks to widen [{listed}], but Delta Lake"
        " (delta-rs) cannot change a column's type in the commit that writes the batch; only"
        " new columns can be added there. Nothing was changed. Fix: cast the batch to the"
        " table's type (e.g. df['col'] = df['col'].astype(...)), or widen the table once (a"
        " rewrite of every row, in one commit: "
        + types.migration([], {}, {c.column: c.type for c in widened})
        + f") and set schema_evolution to {keeps}."
    )


_EVALUATOR: tuple[int, duckdb.DuckDBPyConnection] | None = None


def _evaluator() -> duckdb.DuckDBPyConnection:
    """The process's embedded DuckDB; each backend works in a cursor of its own."""
    global _EVALUATOR
    # Opening a database costs ~10 ms a publish; a cursor costs nothing. A forked child
    # opens its own.
    if _EVALUATOR is None or _EVALUATOR[0] != os.getpid():
        conn = duckdb.connect()
        # Aware timestamps in samples and messages read in UTC, as Delta stores them.
        conn.execute("SET GLOBAL TimeZone = 'UTC'")
        _EVALUATOR = (os.getpid(), conn)
    return _EVALUATOR[1]


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


def _field_type(schema: pa.Schema) -> Callable[[str], pa.DataType]:
    """A column's Arrow type in ``schema``; ``KeyError`` for a column it lacks."""
    return lambda column: schema.field(column).type
