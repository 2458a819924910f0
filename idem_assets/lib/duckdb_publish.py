"""Publish one batch into a DuckDB table: guards first, then one transaction.

This module holds the DuckDB plumbing; the statements come from :mod:`idem_assets.lib.sql` and the
window logic from :mod:`idem_assets.lib.windows`. It needs no Dagster context, so benchmarks and
crash tests drive it directly.
"""

from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import duckdb
import pyarrow as pa

from idem_assets.lib import sql
from idem_assets.lib.errors import (
    DuplicateKeyError,
    EmptyBatchError,
    KeyOutsideWindowError,
    NullValueError,
    SchemaMismatchError,
    StrayRowsError,
    format_sample,
)
from idem_assets.lib.identifiers import qualified, quote, validate_identifier
from idem_assets.lib.runtime_values import check_runtime_values
from idem_assets.lib.settings import WriteSettings
from idem_assets.lib.windows import WriteWindow, bound_for

STAGED = "idem_staged_batch"

_INTEGERS = ["TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT"]
_UNSIGNED = ["UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT"]
_TIMESTAMPS = {"TIMESTAMP", "TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP_NS"}
# DuckDB 2 reads a pandas tz-aware column (nanoseconds) as TIMESTAMPTZ_NS.
_TZ_TIMESTAMPS = {"TIMESTAMP WITH TIME ZONE", "TIMESTAMPTZ", "TIMESTAMPTZ_NS"}
#: The stages a publish passes, in order; ``on_stage`` is called at each.
PUBLISH_STAGES = ("guards_passed", "deleted", "inserted", "before_commit")

#: An ``on_stage`` hook for every publish in this context that passes none, so a test can reach
#: the publish inside an IO manager (``idem_assets.testing`` injects its crashes through it).
STAGE_HOOK: ContextVar[Callable[[str], None] | None] = ContextVar("idem_stage_hook", default=None)


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
    #: For a range publish: partition key to (rows, fingerprint) of that partition.
    per_partition: dict[str, tuple[int, str]] = field(default_factory=dict)


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
        return pa.Table.from_pandas(obj, preserve_index=False)
    raise TypeError(
        f"Asset '{asset}' returned {type(obj).__name__}; the idempotent IO managers store a"
        " pandas DataFrame or a pyarrow Table. Return one of those (an empty one with the right"
        " columns if the partition really has no rows, together with"
        " metadata={'allow_empty': True})."
    )


def _compatible(batch_type: str, table_type: str) -> bool:
    if batch_type == table_type or batch_type == '"NULL"' or batch_type == "NULL":
        return True
    for family in (_INTEGERS, _UNSIGNED):
        if batch_type in family and table_type in family:
            return family.index(batch_type) <= family.index(table_type)
    if batch_type in _TIMESTAMPS and table_type in _TIMESTAMPS:
        return True
    if batch_type in _TZ_TIMESTAMPS and table_type in _TZ_TIMESTAMPS:
        return True
    return batch_type == "FLOAT" and table_type == "DOUBLE"


def _is_timestamp(t: str) -> bool:
    return t in _TIMESTAMPS or t in _TZ_TIMESTAMPS


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
        "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name ="
        " current_database() AND schema_name = ? AND table_name = ? ORDER BY column_index",
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


def check_schema(
    settings: WriteSettings,
    window: WriteWindow | None,
    batch_cols: dict[str, str],
    table_cols: dict[str, str] | None,
) -> None:
    """Refuse a batch whose partition column is not a date/time, or that does not fit the table."""
    where = _where(settings, window)
    for c in batch_cols:
        validate_identifier(c, f"Refused to write {where}: batch column")
    needed = [settings.partition_expr] if settings.partition_expr else []
    needed += list(settings.primary_key) + list(settings.dedupe_order_by)
    absent = [c for c in dict.fromkeys(needed) if c not in batch_cols]
    if absent:
        raise SchemaMismatchError(
            f"Refused to write {where}: the batch has no column(s) {absent}, which the asset's"
            f" metadata names (partition_expr/primary_key/dedupe_order_by). Batch columns:"
            f" {list(batch_cols)}. Fix: add the column(s) to the batch, or correct the metadata."
        )
    if settings.partition_expr:
        ptype = batch_cols[settings.partition_expr]
        if ptype != "DATE" and not _is_timestamp(ptype):
            raise SchemaMismatchError(
                f"Refused to write {where}: partition column '{settings.partition_expr}' is"
                f" {ptype}, not DATE or TIMESTAMP, so window bounds would compare as text. Fix:"
                f" convert it, e.g. df['{settings.partition_expr}'] ="
                f" pd.to_datetime(df['{settings.partition_expr}'])."
            )
    if table_cols is None:
        # A column whose every value is None has no type; the table would keep a "NULL" column
        # that no later batch with real values fits.
        untyped = [c for c, t in batch_cols.items() if t in ('"NULL"', "NULL")]
        if untyped:
            raise SchemaMismatchError(
                f"Refused to write {where}: column(s) {untyped} hold only NULL and have no type,"
                f" so table {settings.schema}.{settings.table} cannot be created from this batch."
                " Nothing was changed. Fix: give the column a type, e.g."
                f" df['{untyped[0]}'] = df['{untyped[0]}'].astype('float64'), or build the Arrow"
                " table with an explicit schema."
            )
        return
    missing = [c for c in table_cols if c not in batch_cols]
    extra = [c for c in batch_cols if c not in table_cols]
    changed = [
        f"{c}: table {table_cols[c]}, batch {batch_cols[c]}"
        for c in batch_cols
        if c in table_cols and not _compatible(batch_cols[c], table_cols[c])
    ]
    if missing or extra or changed:
        target = f"{settings.schema}.{settings.table}"
        problems = []
        if missing:
            problems.append(f"missing columns {missing}")
        if extra:
            problems.append(f"extra columns {extra}")
        if changed:
            problems.append("incompatible types [" + "; ".join(changed) + "]")
        tz_hint = (
            " A TIMESTAMP vs TIMESTAMP WITH TIME ZONE difference means one side is timezone-aware:"
            " make both naive (tz_localize(None)) or both aware."
            if any("TIME ZONE" in c or "TIMESTAMPTZ" in c for c in changed)
            else ""
        )
        raise SchemaMismatchError(
            f"Refused to write {where}: the batch does not match table {target}: "
            + ", ".join(problems)
            + ". Nothing was changed. Fix: make the batch produce the table's columns and types;"
            f" or, for an intended schema change, migrate the table first (ALTER TABLE {target}"
            " ADD COLUMN ... / ALTER COLUMN ... TYPE ...) and rerun." + tz_hint
        )


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
    target = qualified(settings.schema, settings.table)
    where = _where(settings, window)
    conn.register(STAGED, batch)
    failed = False
    try:
        conn.execute("BEGIN TRANSACTION")
        try:
            result = _publish_in_transaction(
                conn, batch, settings, window, target, where, now, on_stage
            )
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
            conn.unregister(STAGED)
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


def _publish_in_transaction(
    conn: duckdb.DuckDBPyConnection,
    batch: pa.Table,
    settings: WriteSettings,
    window: WriteWindow | None,
    target: str,
    where: str,
    now: datetime,
    on_stage: Callable[[str], None],
) -> PublishResult:
    names = batch.column_names
    repeated = sorted({c for c in names if names.count(c) > 1})
    if repeated:
        # DuckDB would rename the second copy (fare_1) and store it as a column of its own.
        raise SchemaMismatchError(
            f"Refused to write {where}: the batch has more than one column named {repeated}."
            " Nothing was changed. Fix: drop or rename the duplicates (e.g. after a join, select"
            " the columns you mean to keep)."
        )
    batch_cols = column_types(conn, STAGED)
    table_cols = table_columns(conn, settings.schema, settings.table)
    check_schema(settings, window, batch_cols, table_cols)

    pcol = settings.partition_expr if window else None
    spans: list[tuple[Any, Any]] = []
    if pcol and window:
        ptype = (table_cols or batch_cols)[pcol]
        spans = [(bound_for(s, ptype), bound_for(e, ptype)) for s, e in window.spans()]
    key = list(settings.primary_key)

    source = STAGED
    # Duplicate keys only matter to a merge; with dedupe_order_by they are resolved in the
    # INSERT itself, so the costly distinct count runs only where it can refuse the batch.
    dedupe = settings.mode == "merge" and bool(settings.dedupe_order_by)
    count_duplicates = settings.mode == "merge" and not dedupe
    q, p = sql.batch_profile(source, pcol, spans, key, count_duplicates)
    rows, null_partition, outside, null_key, duplicates = _one(conn, q, p) or (0,) * 5

    if null_partition:
        raise NullValueError(
            f"Refused to write {where}: {null_partition} of {rows} rows have NULL in partition"
            f" column '{pcol}', so they belong to no partition. Nothing was changed. Fix: drop or"
            f" date those rows before returning the batch. Sample:\n"
            + _sample(conn, sql.null_sample(source, [str(pcol)]))
        )
    if outside and pcol:
        q, p = sql.stray_rows_sample(source, pcol, spans)
        raise StrayRowsError(
            f"Refused to write {where}: {outside} of {rows} rows have '{pcol}' outside the window"
            f" [{window.start if window else ''}, {window.end if window else ''}). Writing them"
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
    check_runtime_values(batch, settings, window, now)

    existing = 0
    if table_cols is not None:
        q, p = sql.count_window(target, pcol, spans)
        existing = (_one(conn, q, p) or (0,))[0]
    # An upsert without deletes cannot erase anything, so only the replacing writes are guarded.
    erases = settings.mode == "overwrite" or settings.delete_missing
    if rows == 0 and existing and erases and not settings.allow_empty:
        raise EmptyBatchError(
            f"Refused to write {where}: the batch is empty but the window holds {existing} rows;"
            " publishing it would silently erase them. Nothing was changed. Fix: find out why"
            " the input is empty; if the partition really is empty now, declare it:"
            " metadata={'allow_empty': True}."
        )

    matched = 0
    if settings.mode == "merge" and table_cols is not None:
        q, p = sql.merge_counts(target, source, key, pcol, spans)
        matched, outside_keys = _one(conn, q, p) or (0, 0)
        if outside_keys and pcol:
            q, p = sql.keys_outside_window_sample(target, source, key, pcol, spans)
            raise KeyOutsideWindowError(
                f"Refused to write {where}: {outside_keys} key(s) of the batch already exist in"
                " other partitions; merging would move those rows out of partitions this run"
                " does not own. Nothing was changed. Fix: rerun the partition that holds them"
                " first so they leave it, or correct the key. Existing rows:\n"
                + _sample(conn, q, p)
            )

    on_stage("guards_passed")
    if table_cols is None:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(settings.schema)}")
        conn.execute(_create_statement(target, source, batch_cols))
    if settings.mode == "merge" and not settings.delete_missing:
        conn.execute(sql.delete_matching_keys(target, source, key))
        deleted = 0
        updated = matched
    else:
        if pcol:
            q, p = sql.delete_window(target, pcol, spans)
            conn.execute(q, p)
        else:
            conn.execute(sql.delete_all(target))
        if settings.mode == "merge":
            updated, deleted = matched, existing - matched
        else:
            updated, deleted = 0, existing
    on_stage("deleted")
    insert_from = (
        f"({sql.dedupe(STAGED, key, settings.dedupe_order_by, list(batch_cols))})"
        if dedupe
        else source
    )
    order_by = pcol if window and len(window.partitions) > 1 else None
    # DuckDB answers an INSERT with the number of rows it wrote: after dedup, the batch's size.
    rows = _one(conn, sql.insert_by_name(target, insert_from, order_by))[0]
    inserted = rows - updated
    on_stage("inserted")

    columns = list(table_cols or batch_cols)
    per_partition: dict[str, tuple[int, str]] = {}
    if pcol and window and len(window.partitions) > 1:
        ptype = (table_cols or batch_cols)[pcol]
        bounds = [
            (w.key, bound_for(w.start, ptype), bound_for(w.end, ptype)) for w in window.partitions
        ]
        q, p = sql.partition_fingerprints(target, columns, pcol, bounds)
        found = {key: (n, d) for key, n, d in conn.execute(q, p).fetchall()}
        per_partition = {
            w.key: (found.get(w.key, (0, 0))[0], _digest(*found.get(w.key, (0, 0))))
            for w in window.partitions
        }
        count = sum(n for n, _ in found.values())
        digest = sum(d for _, d in found.values())
    else:
        q, p = sql.fingerprint(target, columns, pcol, spans)
        count, digest = _one(conn, q, p) or (0, 0)
    return PublishResult(
        rows=count,
        inserted=inserted,
        updated=updated,
        deleted=deleted,
        partitions=window.keys if window else [],
        fingerprint=_digest(count, digest),
        table=f"{settings.schema}.{settings.table}",
        per_partition=per_partition,
    )


def _digest(count: int, hash_sum: int) -> str:
    return f"{count}:{int(hash_sum) % (1 << 128):032x}"


def _create_statement(target: str, source: str, batch_cols: dict[str, str]) -> str:
    # pandas hands DuckDB nanosecond timestamps; store microseconds, DuckDB's native precision,
    # so later Arrow batches and SQL literals compare without casts.
    native = {
        "TIMESTAMP_S": "TIMESTAMP",
        "TIMESTAMP_MS": "TIMESTAMP",
        "TIMESTAMP_NS": "TIMESTAMP",
        "TIMESTAMPTZ_NS": "TIMESTAMPTZ",
    }
    recast = [
        f"CAST({quote(c)} AS {native[t]}) AS {quote(c)}"
        for c, t in batch_cols.items()
        if t in native
    ]
    replace = f" REPLACE ({', '.join(recast)})" if recast else ""
    return f"CREATE TABLE {target} AS SELECT *{replace} FROM {source} LIMIT 0"


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
    q, p = sql.fingerprint(qualified(schema, table), list(cols), partition_column, spans)
    count, digest = _one(conn, q, p) or (0, 0)
    return _digest(count, digest)
