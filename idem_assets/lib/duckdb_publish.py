"""Publish one batch into a DuckDB table: guards first, then one transaction.

This module holds the DuckDB plumbing; the statements come from :mod:`idem_assets.lib.sql`, the
column matching from :mod:`idem_assets.lib.duckdb_columns` and the window logic from
:mod:`idem_assets.lib.windows`. It needs no Dagster context, so benchmarks and crash tests drive
it directly.
"""

import uuid
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import duckdb
import pyarrow as pa

from idem_assets.lib import sql
from idem_assets.lib.duckdb_columns import (
    FLOOR_UNIT,
    StagedColumn,
    refuse_lossy_values,
    refuse_repeated_names,
    stage_columns,
)
from idem_assets.lib.errors import (
    ConfigurationError,
    DuplicateKeyError,
    EmptyBatchError,
    KeyOutsideWindowError,
    NullValueError,
    SchemaMismatchError,
    StrayRowsError,
    format_sample,
)
from idem_assets.lib.identifiers import qualified, quote
from idem_assets.lib.runtime_values import check_runtime_values
from idem_assets.lib.settings import WriteSettings
from idem_assets.lib.windows import PartitionWindow, WriteWindow, bound_for

#: The library's own names are not plain identifiers, so no asset, schema or column can be
#: given one (validate_identifier refuses them) and shadow or be shadowed by them.
BATCH_PREFIX = "idem-batch-"
STAGED_PREFIX = "idem-staged-"
OWNERS_SCHEMA = "main"
OWNERS_TABLE = "idem-table-owners"
OWNERS = f"{quote(OWNERS_SCHEMA)}.{quote(OWNERS_TABLE)}"

_UNIT_NAMES = {"us": "microsecond", "ms": "millisecond", "s": "second"}
#: The stages a publish passes, in order; ``on_stage`` is called at each.
PUBLISH_STAGES = ("guards_passed", "deleted", "inserted", "before_commit")

#: An ``on_stage`` hook for every publish in this context that passes none, so a test can reach
#: the publish inside an IO manager (``idem_assets.testing`` injects its crashes through it).
STAGE_HOOK: ContextVar[Callable[[str], None] | None] = ContextVar("idem_stage_hook", default=None)


@dataclass(frozen=True)
class PartitionResult:
    """What one publish changed in one partition of a range."""

    rows: int
    fingerprint: str
    inserted: int
    updated: int
    deleted: int


@dataclass(frozen=True)
class PublishResult:
    """What one publish changed, for the materialization's metadata."""

    rows: int
    inserted: int
    updated: int
    deleted: int
    partitions: list[str] = field(default_factory=list)
    fingerprint: str = ""
    table: str = ""
    #: For a range publish: each partition's own rows, fingerprint and changes.
    per_partition: dict[str, PartitionResult] = field(default_factory=dict)


def to_arrow(obj: object, asset: str) -> pa.Table:
    """Accept a pyarrow Table or a pandas DataFrame; refuse anything else."""
    if isinstance(obj, pa.Table):
        return obj
    if isinstance(obj, pa.RecordBatch):
        return pa.Table.from_batches([obj])
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is a dependency
        pd = None
    if pd is not None and isinstance(obj, pd.DataFrame):
        return pa.Table.from_pandas(_index_as_columns(obj, asset), preserve_index=False)
    raise TypeError(
        f"Asset '{asset}' returned {type(obj).__name__}; the idempotent IO managers store a"
        " pandas DataFrame or a pyarrow Table. Return one of those (an empty one with the right"
        " columns if the partition really has no rows, together with"
        " metadata={'allow_empty': True})."
    )


def _index_as_columns(frame: Any, asset: str) -> Any:
    """Named index levels become columns, as ``reset_index`` makes them; unnamed ones are dropped.

    A named index holds data (``groupby("zone")`` puts the zones there); an unnamed one is only
    row numbering.
    """
    named = [n for n in frame.index.names if n is not None]
    if not named:
        return frame
    clash = [n for n in named if n in frame.columns]
    if clash:
        raise SchemaMismatchError(
            f"Refused to write asset '{asset}': the DataFrame's index level(s) {clash} have the"
            " name of a column too, so the index cannot be stored next to it. Nothing was"
            " changed. Fix: drop the index if it is only row numbering"
            " (df.reset_index(drop=True)), or rename it (df.rename_axis('other_name'))."
        )
    return frame.reset_index(level=named)


def _one(conn: duckdb.DuckDBPyConnection, query: str, params: Sequence[Any] = ()) -> tuple:
    # Fetch to the end: DuckDB 2 refuses other work on a connection with an unfinished result.
    rows = conn.execute(query, list(params)).fetchall()
    return rows[0] if rows else ()


def column_types(conn: duckdb.DuckDBPyConnection, relation: str) -> dict[str, str]:
    """Column name to DuckDB type of a table, view or registered Arrow table."""
    return {row[0]: row[1] for row in conn.execute(f"DESCRIBE SELECT * FROM {relation}").fetchall()}


def table_columns(
    conn: duckdb.DuckDBPyConnection, schema: str, table: str
) -> dict[str, str] | None:
    """Column name to type of an existing table, or ``None`` when there is no such table."""
    rows = conn.execute(
        # duckdb_columns() is the catalog itself; information_schema is a slower view over it.
        # Names compare without regard to case, as DuckDB resolves them.
        "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name ="
        " current_database() AND lower(schema_name) = lower(?) AND lower(table_name) = lower(?)"
        " ORDER BY column_index",
        [schema, table],
    ).fetchall()
    return {r[0]: r[1] for r in rows} if rows else None


def _sample(conn: duckdb.DuckDBPyConnection, query: str, params: Sequence[Any] = ()) -> str:
    cur = conn.execute(query, list(params))
    cols = [d[0] for d in cur.description or []]
    return format_sample(cols, cur.fetchall())


def _where(settings: WriteSettings, window: WriteWindow | None) -> str:
    where = f"asset '{settings.asset}'"
    return f"{where}, partition {window.describe()}" if window else where


def publish(
    conn: duckdb.DuckDBPyConnection,
    batch: pa.Table,
    settings: WriteSettings,
    window: WriteWindow | None,
    *,
    now: datetime | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> PublishResult:
    """Check ``batch`` against every guard, then replace the window with it in one transaction.

    Raises one of the :class:`~idem_assets.lib.errors.IdempotencyError` subclasses, with the
    transaction rolled back, when the write would not be safe to rerun.

    ``on_stage`` is a test hook for fault and crash injection: it is called with
    ``"guards_passed"``, ``"deleted"``, ``"inserted"`` and ``"before_commit"`` as the transaction
    reaches each point, so a test can raise (or kill the process) there and prove the old
    window survives. Production callers leave it unset.
    """
    now = now or datetime.now(UTC)
    on_stage = on_stage or STAGE_HOOK.get() or _no_stage
    where = _where(settings, window)
    refuse_repeated_names(batch.column_names, where)
    # Unique per publish: cursors of one connection share its registered names.
    token = uuid.uuid4().hex
    raw, staged = BATCH_PREFIX + token, STAGED_PREFIX + token
    conn.register(raw, batch)
    failed = False
    try:
        conn.execute("BEGIN TRANSACTION")
        try:
            result = _publish_in_transaction(
                conn, batch, quote(raw), quote(staged), settings, window, where, now, on_stage
            )
            conn.execute(f"DROP VIEW IF EXISTS {quote(staged)}")
            on_stage("before_commit")
            conn.execute("COMMIT")
            return result
        except BaseException as exc:
            failed = True
            try:
                conn.execute("ROLLBACK")
            except duckdb.Error:
                # A failed COMMIT has already ended the transaction, and a fatal error
                # invalidates the connection: the error that got us here is the one to report.
                pass
            if isinstance(exc, duckdb.Error):
                exc.add_note(_database_failed(where))
            raise
    finally:
        try:
            conn.unregister(raw)
        except duckdb.Error:
            if not failed:
                raise


def _database_failed(where: str) -> str:
    return (
        f"Publishing {where} failed inside the database. The write is one transaction, so the"
        " window holds its previous rows (or, if the commit reached the WAL before the failure,"
        " this whole batch), never a mix. Fix the cause named above, then rerun the partition:"
        " free disk space for 'No space left on device'; open the database read-write, or make"
        " the file writable, for 'read-only mode' or 'Permission denied'; let the other writer"
        " finish for a lock or a conflict."
    )


def _no_stage(stage: str) -> None:
    pass


def _stage(
    conn: duckdb.DuckDBPyConnection,
    raw: str,
    staged: str,
    settings: WriteSettings,
    where: str,
    table_cols: dict[str, str] | None,
) -> tuple[list[StagedColumn], WriteSettings, str]:
    """Create the staged view: the batch cast to the stored types, under the stored names.

    Returns its columns, the settings with every column name spelt as stored, and the relation
    to read: the view, or the batch itself when it already has the stored names and types.
    """
    columns = stage_columns(settings, where, column_types(conn, raw), table_cols)
    checked = [c for c in columns if c.conversion == "checked"]
    if checked:
        found = _one(
            conn, sql.lossy_values(raw, [(c.name, c.type, c.stored_type) for c in checked])
        )
        for i, column in enumerate(checked):
            if found[2 * i]:
                target = f"{settings.schema}.{settings.table}"
                refuse_lossy_values(where, target, column, found[2 * i], found[2 * i + 1])
    source = raw
    if any(c.conversion != "same" or c.name != c.stored_name for c in columns):
        selects = ", ".join(c.select() for c in columns)
        conn.execute(f"CREATE TEMP VIEW {staged} AS SELECT {selects} FROM {raw}")
        source = staged
    stored = {c.name.lower(): c.stored_name for c in columns}

    def spelt(names: Sequence[str]) -> tuple[str, ...]:
        return tuple(stored[n.lower()] for n in names)

    pcol = settings.partition_expr
    spelt_settings = replace(
        settings,
        partition_expr=stored[pcol.lower()] if pcol else None,
        primary_key=spelt(settings.primary_key),
        dedupe_order_by=spelt(settings.dedupe_order_by),
    )
    return columns, spelt_settings, source


@dataclass(frozen=True)
class _Scope:
    """What one publish writes: the staged batch, the target table and the window's bounds."""

    settings: WriteSettings
    window: WriteWindow | None
    where: str
    raw: str
    #: The batch as stored: the staged view, or the raw batch when it needs no cast.
    staged: str
    target: str
    columns: list[StagedColumn]
    table_exists: bool
    pcol: str | None
    spans: list[tuple[Any, Any]]
    #: A range's partitions with their bounds; empty for one partition or none.
    bounds: list[tuple[str, Any, Any]]

    @property
    def key(self) -> list[str]:
        """The merge key, spelt as stored."""
        return list(self.settings.primary_key)

    @property
    def stored_types(self) -> dict[str, str]:
        """Stored column name to stored type."""
        return {c.stored_name: c.stored_type for c in self.columns}


def _scope(
    conn: duckdb.DuckDBPyConnection,
    raw: str,
    staged: str,
    settings: WriteSettings,
    window: WriteWindow | None,
    where: str,
    table_cols: dict[str, str] | None,
) -> _Scope:
    """Stage the batch and work out the window's bounds in the stored partition column's type."""
    columns, settings, source = _stage(conn, raw, staged, settings, where, table_cols)
    pcol = settings.partition_expr if window else None
    spans: list[tuple[Any, Any]] = []
    bounds: list[tuple[str, Any, Any]] = []
    if pcol and window:
        ptype = next(c.stored_type for c in columns if c.stored_name == pcol)
        spans = [(bound_for(s, ptype), bound_for(e, ptype)) for s, e in window.spans()]
        if len(window.partitions) > 1:
            bounds = [
                (p.key, bound_for(p.start, ptype), bound_for(p.end, ptype))
                for p in window.partitions
            ]
    return _Scope(
        settings=settings,
        window=window,
        where=where,
        raw=raw,
        staged=source,
        target=qualified(settings.schema, settings.table),
        columns=columns,
        table_exists=table_cols is not None,
        pcol=pcol,
        spans=spans,
        bounds=bounds,
    )


def _publish_in_transaction(
    conn: duckdb.DuckDBPyConnection,
    batch: pa.Table,
    raw: str,
    staged: str,
    settings: WriteSettings,
    window: WriteWindow | None,
    where: str,
    now: datetime,
    on_stage: Callable[[str], None],
) -> PublishResult:
    table_cols, owners_exist = _catalog(conn, settings.schema, settings.table)
    owner = table_owner(conn, settings.schema, settings.table) if owners_exist else None
    if owner is not None and owner != settings.asset:
        _refuse_other_owner(settings, where, owner)
    scope = _scope(conn, raw, staged, settings, window, where, table_cols)
    rows = _refuse_unsafe_rows(conn, scope)
    check_runtime_values(batch, settings, window, now)
    existing = _existing_rows(conn, scope)
    _refuse_erasing(conn, scope, rows, existing)
    matched = _matched_rows(conn, scope)

    on_stage("guards_passed")
    if owner is None:
        claim_table(conn, settings.schema, settings.table, settings.asset)
    inserted, updated, deleted = _write(conn, scope, existing, matched, on_stage)
    on_stage("inserted")
    return _result(conn, scope, inserted, updated, deleted, existing, matched)


def _refuse_unsafe_rows(conn: duckdb.DuckDBPyConnection, scope: _Scope) -> int:
    """Refuse NULL or stray partition values, NULL keys and (for a merge) duplicate keys.

    Returns the batch's row count.
    """
    source, pcol, spans, key, where = scope.staged, scope.pcol, scope.spans, scope.key, scope.where
    settings = scope.settings
    # Duplicate keys only matter to a merge; with dedupe_order_by they are resolved in the
    # INSERT itself, so the costly distinct count runs only where it can refuse the batch.
    count_duplicates = settings.mode == "merge" and not settings.dedupe_order_by
    q, p = sql.batch_profile(source, pcol, spans, key, count_duplicates)
    rows, null_partition, outside, null_key, duplicates = _one(conn, q, p) or (0,) * 5

    if null_partition:
        raise NullValueError(
            f"Refused to write {where}: {null_partition} of {rows} rows have NULL in partition"
            f" column '{pcol}', so they belong to no partition. Nothing was changed. Fix: drop or"
            f" date those rows before returning the batch. Sample:\n"
            + _sample(conn, sql.null_sample(source, [str(pcol)]))
        )
    if outside and pcol and scope.window:
        window = scope.window
        partition_column = next(c for c in scope.columns if c.stored_name == pcol)
        _refuse_rounded_out(conn, scope.raw, partition_column, window, spans, rows, where)
        q, p = sql.stray_rows_sample(source, pcol, spans)
        raise StrayRowsError(
            f"Refused to write {where}: {outside} of {rows} rows have '{pcol}' outside the window"
            f" [{window.start}, {window.end}). Writing them"
            " would put rows into another partition (or, for a partition overwrite, wipe it)."
            " Nothing was changed. Fix: filter the batch to the run's window"
            " (context.partition_time_window), or route those rows to their own partition's"
            " run. Sample:\n" + _sample(conn, q, p)
        )
    if null_key:
        raise NullValueError(
            f"Refused to write {where}: {null_key} rows have NULL in key column(s) {key}, so they"
            " can never be matched by a rerun. Nothing was changed. Fix: fill or drop them."
            " Sample:\n" + _sample(conn, sql.null_sample(source, key))
        )
    if duplicates:
        raise DuplicateKeyError(
            f"Refused to write {where}: the batch holds {duplicates} extra row(s) for keys that"
            f" appear more than once in {key}; a merge would keep an arbitrary one or insert"
            " both. Nothing was changed. Fix: deduplicate the batch, or name the column(s) that"
            " pick the winner (the latest wins): metadata={'primary_key': "
            f"{key!r}, 'dedupe_order_by': ['updated_at']}}. Sample:\n"
            + _sample(conn, sql.duplicate_key_sample(source, key))
        )
    return rows


def _existing_rows(conn: duckdb.DuckDBPyConnection, scope: _Scope) -> dict[str | None, int]:
    """Rows the window holds now: per partition of a range, else under the key ``None``."""
    if not scope.table_exists:
        return {}
    if scope.bounds and scope.pcol:
        q, p = sql.count_by_partition(scope.target, scope.pcol, scope.bounds)
        return dict(conn.execute(q, p).fetchall())
    q, p = sql.count_window(scope.target, scope.pcol, scope.spans)
    return {None: (_one(conn, q, p) or (0,))[0]}


def _refuse_erasing(
    conn: duckdb.DuckDBPyConnection, scope: _Scope, rows: int, existing: dict[str | None, int]
) -> None:
    """Refuse a batch that would empty a partition holding rows, unless that is declared."""
    settings = scope.settings
    # An upsert without deletes cannot erase anything, so only the replacing writes are guarded.
    erases = settings.mode == "overwrite" or settings.delete_missing
    total = sum(existing.values())
    if not total or not erases or settings.allow_empty:
        return
    if scope.bounds and scope.pcol:
        _refuse_emptied_partitions(
            conn, scope.staged, scope.pcol, scope.bounds, existing, rows, scope.where
        )
    elif rows == 0:
        raise EmptyBatchError(
            f"Refused to write {scope.where}: the batch is empty but the window holds {total}"
            " rows; publishing it would silently erase them. Nothing was changed. Fix: find"
            " out why the input is empty; if the partition really is empty now, declare it:"
            " metadata={'allow_empty': True}."
        )


def _matched_rows(conn: duckdb.DuckDBPyConnection, scope: _Scope) -> dict[str | None, int]:
    """For a merge, the window's rows whose key the batch holds (keyed like existing rows).

    Refuses a batch whose keys already live outside the window.
    """
    if scope.settings.mode != "merge" or not scope.table_exists:
        return {}
    target, source, key, pcol = scope.target, scope.staged, scope.key, scope.pcol
    matched: dict[str | None, int]
    if scope.bounds and pcol:
        q, p = sql.matched_by_partition(target, source, key, pcol, scope.bounds)
        matched = dict(conn.execute(q, p).fetchall())
        outside_keys = matched.pop(None, 0)
    else:
        q, p = sql.merge_counts(target, source, key, pcol, scope.spans)
        in_window, outside_keys = _one(conn, q, p) or (0, 0)
        matched = {None: in_window}
    if outside_keys and pcol:
        q, p = sql.keys_outside_window_sample(target, source, key, pcol, scope.spans)
        raise KeyOutsideWindowError(
            f"Refused to write {scope.where}: {outside_keys} key(s) of the batch already exist"
            " in other partitions; merging would move those rows out of partitions this run"
            " does not own. Nothing was changed. Fix: rerun the partition that holds them"
            " first so they leave it, or correct the key. Existing rows:\n" + _sample(conn, q, p)
        )
    return matched


def _write(
    conn: duckdb.DuckDBPyConnection,
    scope: _Scope,
    existing: dict[str | None, int],
    matched: dict[str | None, int],
    on_stage: Callable[[str], None],
) -> tuple[int, int, int]:
    """Create the table if needed, delete the window (or the batch's keys), insert the batch.

    Returns the rows inserted, updated and deleted.
    """
    settings, target, source, key, pcol = (
        scope.settings,
        scope.target,
        scope.staged,
        scope.key,
        scope.pcol,
    )
    if not scope.table_exists:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(settings.schema)}")
        conn.execute(f"CREATE TABLE {target} AS SELECT * FROM {source} LIMIT 0")
    updated = sum(matched.values())
    if settings.mode == "merge" and not settings.delete_missing:
        conn.execute(sql.delete_matching_keys(target, source, key))
        deleted = 0
    else:
        if pcol:
            q, p = sql.delete_window(target, pcol, scope.spans)
            conn.execute(q, p)
        else:
            conn.execute(sql.delete_all(target))
        deleted = sum(existing.values()) - updated
    on_stage("deleted")
    insert_from = (
        f"({sql.dedupe(source, key, settings.dedupe_order_by, list(scope.stored_types))})"
        if settings.mode == "merge" and settings.dedupe_order_by
        else source
    )
    order_by = pcol if scope.bounds else None
    # DuckDB answers an INSERT with the number of rows it wrote: after dedup, the batch's size.
    rows = _one(conn, sql.insert_by_name(target, insert_from, order_by))[0]
    return rows - updated, updated, deleted


def _result(
    conn: duckdb.DuckDBPyConnection,
    scope: _Scope,
    inserted: int,
    updated: int,
    deleted: int,
    existing: dict[str | None, int],
    matched: dict[str | None, int],
) -> PublishResult:
    """Fingerprint what the window holds now, per partition for a range."""
    columns = [c.stored_name for c in scope.columns]
    per_partition: dict[str, PartitionResult] = {}
    if scope.bounds and scope.pcol and scope.window:
        q, p = sql.partition_fingerprints(scope.target, columns, scope.pcol, scope.bounds)
        found = {k: (n, d) for k, n, d in conn.execute(q, p).fetchall()}
        per_partition = {
            part.key: _partition_result(
                scope.settings, found.get(part.key, (0, 0)), existing, matched, part
            )
            for part in scope.window.partitions
        }
        count = sum(n for n, _ in found.values())
        digest = sum(d for _, d in found.values())
    else:
        q, p = sql.fingerprint(scope.target, columns, scope.pcol, scope.spans)
        count, digest = _one(conn, q, p) or (0, 0)
    return PublishResult(
        rows=count,
        inserted=inserted,
        updated=updated,
        deleted=deleted,
        partitions=scope.window.keys if scope.window else [],
        fingerprint=_digest(count, digest),
        table=f"{scope.settings.schema}.{scope.settings.table}",
        per_partition=per_partition,
    )


def _partition_result(
    settings: WriteSettings,
    stored: tuple[int, int],
    existing: dict[str | None, int],
    matched: dict[str | None, int],
    part: PartitionWindow,
) -> PartitionResult:
    """One partition's share of a range publish, from counts taken in its transaction."""
    rows, before, hits = stored[0], existing.get(part.key, 0), matched.get(part.key, 0)
    if settings.mode == "overwrite":
        inserted, updated, deleted = rows, 0, before
    elif settings.delete_missing:
        inserted, updated, deleted = rows - hits, hits, before - hits
    else:
        inserted, updated, deleted = rows - before, hits, 0
    return PartitionResult(rows, _digest(*stored), inserted, updated, deleted)


def _refuse_rounded_out(
    conn: duckdb.DuckDBPyConnection,
    raw: str,
    column: StagedColumn,
    window: WriteWindow,
    spans: Sequence[tuple[Any, Any]],
    rows: int,
    where: str,
) -> None:
    """Refuse rows that lie inside the window as sent but outside it once stored."""
    if column.type == column.stored_type:
        return
    batch_spans = [
        (bound_for(s, column.type), bound_for(e, column.type)) for s, e in window.spans()
    ]
    q, p = sql.rounded_out_of_window(raw, column.name, column.stored_expression, batch_spans, spans)
    found = conn.execute(q, p).fetchall()
    if not found:
        return
    unit = FLOOR_UNIT.get(column.stored_type, "us")
    c = column.name
    raise StrayRowsError(
        f"Refused to write {where}: {found[0][2]} of {rows} rows have '{c}' inside the window at"
        f" the batch's precision ({column.type}) but outside it as stored: the table's"
        f" {column.stored_type} rounds to the nearest {_UNIT_NAMES[unit]}, so {found[0][0]} becomes"
        f" {found[0][1]}. Stored there, a row would belong to the next partition: that"
        " partition's run would delete it, and every rerun of this one would add it again."
        " Nothing was changed. Fix: floor the column to the stored precision before returning"
        f" it, e.g. df['{c}'] = df['{c}'].dt.floor('{unit}'). Sample:\n"
        + format_sample(["batch_value", "stored_value"], [r[:2] for r in found])
    )


def _refuse_emptied_partitions(
    conn: duckdb.DuckDBPyConnection,
    source: str,
    pcol: str,
    bounds: Sequence[tuple[str, Any, Any]],
    existing: dict[str | None, int],
    rows: int,
    where: str,
) -> None:
    """Refuse a range batch with no rows for a partition that holds rows."""
    batch_by_part: dict[str, int] = {}
    if rows:
        q, p = sql.count_by_partition(source, pcol, bounds)
        batch_by_part = dict(conn.execute(q, p).fetchall())
    emptied = [k for k, _, _ in bounds if existing.get(k) and not batch_by_part.get(k)]
    if emptied:
        raise EmptyBatchError(
            f"Refused to write {where}: the batch has no rows for partition(s) {emptied}, which"
            f" hold {[existing[k] for k in emptied]} rows; publishing it would silently erase"
            " them. Nothing was changed. Fix: find out why the input has no rows for them (or"
            " run only the partitions it covers); if they really are empty now, declare it:"
            " metadata={'allow_empty': True}."
        )


def _catalog(
    conn: duckdb.DuckDBPyConnection, schema: str, table: str
) -> tuple[dict[str, str] | None, bool]:
    """The columns of ``schema.table`` (as :func:`table_columns`), and whether owners are kept.

    One catalog scan for both: a publish pays for every statement, however small.
    """
    rows = conn.execute(
        "SELECT table_name = ? AND schema_name = ?, column_name, data_type FROM duckdb_columns()"
        " WHERE database_name = current_database() AND ((lower(schema_name) = lower(?) AND"
        " lower(table_name) = lower(?)) OR (schema_name = ? AND table_name = ?))"
        " ORDER BY column_index",
        [OWNERS_TABLE, OWNERS_SCHEMA, schema, table, OWNERS_SCHEMA, OWNERS_TABLE],
    ).fetchall()
    columns = {name: kind for own, name, kind in rows if not own}
    return columns or None, any(own for own, _, _ in rows)


def table_owner(conn: duckdb.DuckDBPyConnection, schema: str, table: str) -> str | None:
    """The asset key (user string) that owns ``schema.table``, or ``None`` if none claimed it.

    Call it only where the owners table exists (see :func:`_catalog`).
    """
    rows = conn.execute(
        f"SELECT asset_key FROM {OWNERS} WHERE schema_key = ? AND table_key = ?",
        [schema.lower(), table.lower()],
    ).fetchall()
    return rows[0][0] if rows else None


def claim_table(conn: duckdb.DuckDBPyConnection, schema: str, table: str, asset: str) -> None:
    """Record ``asset`` as the owner of ``schema.table`` (names compared without case)."""
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {OWNERS} (schema_key VARCHAR, table_key VARCHAR,"
        " asset_key VARCHAR NOT NULL, PRIMARY KEY (schema_key, table_key))"
    )
    conn.execute(f"INSERT INTO {OWNERS} VALUES (?, ?, ?)", [schema.lower(), table.lower(), asset])


def _refuse_other_owner(settings: WriteSettings, where: str, owner: str) -> None:
    target = f"{settings.schema}.{settings.table}"
    prefix = settings.asset.split("/")[:-1]
    by_case = (
        " The two asset keys differ only in case, and DuckDB compares names without regard to case."
        if owner.lower() == settings.asset.lower()
        else ""
    )
    own_table = (
        f"metadata={{'schema': '{prefix[-1]}'}} (or leave the IO manager's 'schema' unset, so"
        " the key prefix names the schema)"
        if prefix and prefix[-1].lower() != settings.schema.lower()
        else "another asset name, or metadata={'schema': '<a schema of its own>'}"
    )
    raise ConfigurationError(
        f"Refused to write {where}: table {target} belongs to asset '{owner}', which wrote it"
        f" first; two assets writing one table would replace each other's rows.{by_case}"
        f" Nothing was changed. Fix: give this asset a table of its own: {own_table}. If this"
        f" asset replaces '{owner}' (a renamed asset), hand the table over first: UPDATE"
        f" {OWNERS} SET asset_key = '{settings.asset}' WHERE schema_key ="
        f" '{settings.schema.lower()}' AND table_key = '{settings.table.lower()}'."
    )


def _digest(count: int, hash_sum: int) -> str:
    return f"{count}:{int(hash_sum) % (1 << 128):032x}"


def table_fingerprint(
    conn: duckdb.DuckDBPyConnection,
    schema: str,
    table: str,
    partition_column: str | None = None,
    window: WriteWindow | None = None,
) -> str | None:
    """Fingerprint a table (or one window of it); ``None`` when the table does not exist."""
    cols = table_columns(conn, schema, table)
    if cols is None:
        return None
    spans: list[tuple[Any, Any]] = []
    if partition_column and window:
        spans = [
            (bound_for(s, cols[partition_column]), bound_for(e, cols[partition_column]))
            for s, e in window.spans()
        ]
    # The library's own table has a name no user table can have, so it skips that check.
    own = (schema, table) == (OWNERS_SCHEMA, OWNERS_TABLE)
    target = OWNERS if own else qualified(schema, table)
    q, p = sql.fingerprint(target, list(cols), partition_column, spans)
    count, digest = _one(conn, q, p) or (0, 0)
    return _digest(count, digest)
