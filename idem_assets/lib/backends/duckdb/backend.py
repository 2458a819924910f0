"""The DuckDB backend: stages, counts, writes and fingerprints a window in one DuckDB transaction.

The refusals are the guards' (:mod:`idem_assets.lib.write.guards`); this module holds only what DuckDB
does differently: its catalog, its type names and casts (:mod:`.duckdb_types`) and its dialect
(:mod:`.duckdb_sql`). Which column goes where is :mod:`idem_assets.lib.write.schema_fit`'s decision.

The staged batch is a view over the registered Arrow batch that casts it the way DuckDB stores it,
rounding timestamps to the column's unit, so the guards judge it in this same connection without
a copy; each column the cast rounds is reported (``Staged.rounds``), so a value the rounding moves
out of the window is refused with the floor that keeps it in, rather than silently floored.
"""

import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa

from idem_assets.lib.backends.duckdb import sql
from idem_assets.lib.backends.duckdb.types import (
    DUCKDB_TYPES,
    arrow_type,
    cast_sql,
    duckdb_type,
)
from idem_assets.lib.model.identifiers import qualified, quote
from idem_assets.lib.model.samples import sample_text
from idem_assets.lib.model.settings import WriteSettings, spelt_partitions
from idem_assets.lib.model.windows import WriteWindow, region_of
from idem_assets.lib.sql import statements as batch_sql
from idem_assets.lib.write.schema_fit import (
    ColumnFit,
    SchemaChange,
    change_sql,
    evolved,
    fit_columns,
    refuse_lossy_values,
    schema_changes,
)
from idem_assets.lib.write.seam import (
    Counts,
    PartitionColumns,
    Rounding,
    Scope,
    Staged,
    Target,
)

#: The library's own names are not plain identifiers, so no asset, schema or column can be
#: given one (validate_identifier refuses them) and shadow or be shadowed by them.
BATCH_PREFIX = "idem-batch-"
STAGED_PREFIX = "idem-staged-"
OWNERS_SCHEMA = "main"
OWNERS_TABLE = "idem-table-owners"
OWNERS = f"{quote(OWNERS_SCHEMA)}.{quote(OWNERS_TABLE)}"
_OWNERS_NAME = (OWNERS_SCHEMA, OWNERS_TABLE)


def _one(conn: duckdb.DuckDBPyConnection, query: str, params: Sequence[Any] = ()) -> tuple:
    # Fetch to the end: DuckDB 2 refuses other work on a connection with an unfinished result.
    rows = conn.execute(query, list(params)).fetchall()
    return rows[0] if rows else ()


def table_columns(
    conn: duckdb.DuckDBPyConnection, schema: str, table: str
) -> dict[str, str] | None:
    """Column name to DuckDB type of an existing table, or ``None`` when there is no such table."""
    rows = conn.execute(
        # duckdb_columns() is the catalog itself; information_schema is a slower view over it.
        # Names compare without regard to case, as DuckDB resolves them.
        "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name ="
        " current_database() AND lower(schema_name) = lower(?) AND lower(table_name) = lower(?)"
        " ORDER BY column_index",
        [schema, table],
    ).fetchall()
    return {r[0]: r[1] for r in rows} if rows else None


class DuckDBBackend:
    """Publishes through one open DuckDB connection; the caller owns (and closes) it."""

    engine = "DuckDB"

    def __init__(self, conn: duckdb.DuckDBPyConnection) -> None:
        """Wrap ``conn``; nothing is read until a publish asks."""
        self.conn = conn
        #: The table's columns as the catalog spells their types (None: no table yet).
        self._table_sql: dict[str, str] | None = None
        self._owners_exist = False
        self._registered: list[str] = []
        self._views: list[str] = []
        self._columns: list[ColumnFit] = []
        self._raw = ""

    @contextmanager
    def transaction(self, where: str) -> Iterator[None]:
        """BEGIN, then COMMIT, or ROLLBACK and name the database failure."""
        conn = self.conn
        failed = False
        try:
            conn.execute("BEGIN TRANSACTION")
            try:
                yield
                for view in self._views:
                    # Dropped inside the transaction, so a commit leaves nothing behind.
                    conn.execute(f"DROP VIEW IF EXISTS {view}")
                conn.execute("COMMIT")
            except BaseException as exc:
                failed = True
                try:
                    conn.execute("ROLLBACK")
                except duckdb.Error:
                    # A failed COMMIT has already ended the transaction, and a fatal error
                    # invalidates the connection: the error that got us here is the one to
                    # report.
                    pass
                if isinstance(exc, duckdb.Error):
                    exc.add_note(_database_failed(where))
                raise
        finally:
            for name in self._registered:
                try:
                    conn.unregister(name)
                except duckdb.Error:
                    if not failed:
                        raise
            self._registered, self._views = [], []

    def evaluator(self) -> duckdb.DuckDBPyConnection:
        """The connection itself: the staged view lives in it."""
        return self.conn

    def describe(self, settings: WriteSettings) -> Target:
        """One catalog scan for the table's columns and the owners table."""
        rows = self.conn.execute(
            "SELECT table_name = ? AND schema_name = ?, column_name, data_type FROM"
            " duckdb_columns() WHERE database_name = current_database() AND ((lower(schema_name)"
            " = lower(?) AND lower(table_name) = lower(?)) OR (schema_name = ? AND table_name ="
            " ?)) ORDER BY column_index",
            [OWNERS_TABLE, OWNERS_SCHEMA, settings.schema, settings.table, *_OWNERS_NAME],
        ).fetchall()
        self._table_sql = {name: kind for own, name, kind in rows if not own} or None
        self._owners_exist = any(own for own, _, _ in rows)
        owner = None
        if self._owners_exist:
            found = self.conn.execute(
                f"SELECT asset_key FROM {OWNERS} WHERE schema_key = ? AND table_key = ?",
                [settings.schema.lower(), settings.table.lower()],
            ).fetchall()
            owner = found[0][0] if found else None
        return Target(exists=self._table_sql is not None, owner=owner)

    def stage(self, batch: pa.Table, settings: WriteSettings, where: str) -> Staged:
        """Register the batch and, where a type or name differs, a view casting it as stored."""
        conn = self.conn
        table, changes = None, []
        if self._table_sql is not None:
            table = {c: arrow_type(t) for c, t in self._table_sql.items()}
            changes = schema_changes(settings, where, batch.schema, table, DUCKDB_TYPES)
            table = evolved(table, changes)
            # The staged view casts to the types the table has once evolve has run.
            self._table_sql |= {c.column: DUCKDB_TYPES.type_sql(c.type) for c in changes}
        columns = fit_columns(settings, where, batch.schema, table, DUCKDB_TYPES)
        refuse_lossy_values(batch, columns, settings, where, DUCKDB_TYPES)
        # Unique per publish: cursors of one connection share its registered names.
        token = uuid.uuid4().hex
        raw, staged = BATCH_PREFIX + token, STAGED_PREFIX + token
        conn.register(raw, batch)
        self._registered.append(raw)
        self._raw = quote(raw)
        self._columns = columns
        source = quote(raw)
        if any(self._stored_expression(c) != quote(c.stored_name) for c in columns):
            selects = ", ".join(
                f"{self._stored_expression(c)} AS {quote(c.stored_name)}" for c in columns
            )
            # A temporary view, dropped by the rollback or before the commit.
            conn.execute(f"CREATE TEMP VIEW {quote(staged)} AS SELECT {selects} FROM {source}")
            source = quote(staged)
            self._views.append(source)
        stored = {c.name.lower(): c.stored_name for c in columns}

        def spelt(names: Sequence[str]) -> tuple[str, ...]:
            return tuple(stored[n.lower()] for n in names)

        spelt_settings = spelt_partitions(settings, stored)
        spelt_settings = replace(
            spelt_settings,
            primary_key=spelt(settings.primary_key),
            dedupe_order_by=spelt(settings.dedupe_order_by),
        )
        types = {c.stored_name: c.stored_type for c in columns}
        return Staged(
            relation=source,
            settings=spelt_settings,
            partition_types={c: types[c] for c in spelt_settings.partition_names},
            changes=tuple(changes),
            rounds=tuple(self._rounding(c) for c in columns if _rounds(c)),
            sent=self._raw,
        )

    def _rounding(self, column: ColumnFit) -> Rounding:
        """The rounding DuckDB's cast applies to ``column``: to its stored unit."""
        unit = column.stored_type.unit
        return Rounding(column.name, column.stored_name, _DIGITS[unit], self._stored_sql(column))

    def evolve(self, settings: WriteSettings, changes: Sequence[SchemaChange]) -> None:
        """Run each change's ALTER TABLE: DuckDB's DDL is part of the open transaction."""
        target = qualified(settings.schema, settings.table)
        for change in changes:
            self.conn.execute(change_sql(target, change, DUCKDB_TYPES))

    def _stored_sql(self, column: ColumnFit) -> str:
        """The stored column's DuckDB type: the catalog's, or the one a new table takes."""
        if self._table_sql is not None:
            return self._table_sql[column.stored_name]
        return DUCKDB_TYPES.type_sql(column.stored_type)

    def _stored_expression(self, column: ColumnFit) -> str:
        """The batch value as it will be stored: cast (and rounded) by DuckDB."""
        return cast_sql(quote(column.name), duckdb_type(column.type), self._stored_sql(column))

    def column_types(self, settings: WriteSettings) -> dict[str, pa.DataType] | None:
        """The table's columns as Arrow types, read from a zero-row select."""
        if table_columns(self.conn, settings.schema, settings.table) is None:
            return None
        target = qualified(settings.schema, settings.table)
        schema = self.conn.sql(f"SELECT * FROM {target} LIMIT 0").to_arrow_table().schema
        return {f.name: f.type for f in schema}

    def count_window(self, scope: Scope) -> Counts:
        """Rows the window holds now: per partition of a range, else under the key ``None``."""
        if not scope.table_exists:
            return {}
        target = _target(scope)
        if scope.cells:
            q, p = sql.count_by_partition(target, scope.cells)
            return dict(self.conn.execute(q, p).fetchall())
        q, p = sql.count_window(target, scope.region)
        return {None: (_one(self.conn, q, p) or (0,))[0]}

    def count_keys(self, scope: Scope) -> tuple[Counts, int]:
        """For a merge, the window's rows whose key the batch holds, and those elsewhere."""
        if scope.settings.mode != "merge" or not scope.table_exists:
            return {}, 0
        target, source, key = _target(scope), scope.staged.relation, scope.key
        if scope.cells:
            q, p = sql.matched_by_partition(target, source, key, scope.cells)
            matched: Counts = dict(self.conn.execute(q, p).fetchall())
            return matched, matched.pop(None, 0)
        q, p = sql.merge_counts(target, source, key, scope.region)
        in_window, outside_keys = _one(self.conn, q, p) or (0, 0)
        return {None: in_window}, outside_keys

    def keys_elsewhere_sample(self, scope: Scope) -> str:
        """A few target rows outside the window whose key the batch holds."""
        q, p = sql.keys_outside_window_sample(
            _target(scope), scope.staged.relation, scope.key, scope.region
        )
        return sample_text(self.conn, q, p)

    def claim(self, settings: WriteSettings) -> None:
        """Record the asset as the owner of its table (names compared without case)."""
        claim_table(self.conn, settings.schema, settings.table, settings.asset)

    def owners_text(self) -> str:
        """The owners table as SQL spells it."""
        return OWNERS

    def _create(self, scope: Scope) -> None:
        if not scope.table_exists:
            self.conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(scope.settings.schema)}")
            self.conn.execute(
                f"CREATE TABLE {_target(scope)} AS SELECT * FROM {scope.staged.relation} LIMIT 0"
            )

    def _insert(self, scope: Scope, source: str) -> int:
        order_by = scope.pcols if scope.cells else ()
        # DuckDB answers an INSERT with the number of rows it wrote: after dedup, the batch's size.
        return _one(self.conn, sql.insert_by_name(_target(scope), source, order_by))[0]

    def replace(self, scope: Scope, on_stage: Callable[[str], None]) -> int:
        """Delete the window (the whole table when unpartitioned), then insert the batch."""
        self._create(scope)
        if scope.region:
            q, p = sql.delete_window(_target(scope), scope.region)
            self.conn.execute(q, p)
        else:
            self.conn.execute(sql.delete_all(_target(scope)))
        on_stage("deleted")
        return self._insert(scope, scope.staged.relation)

    def merge(self, scope: Scope, on_stage: Callable[[str], None]) -> int:
        """Delete the batch's keys (the whole window with delete_missing), insert the batch."""
        self._create(scope)
        settings, target, source = scope.settings, _target(scope), scope.staged.relation
        if settings.delete_missing and scope.region:
            q, p = sql.delete_window(target, scope.region)
            self.conn.execute(q, p)
        elif settings.delete_missing:
            self.conn.execute(sql.delete_all(target))
        else:
            self.conn.execute(sql.delete_matching_keys(target, source, scope.key))
        on_stage("deleted")
        if settings.dedupe_order_by:
            columns = [c.stored_name for c in self._columns]
            source = f"({batch_sql.dedupe(source, scope.key, settings.dedupe_order_by, columns)})"
        return self._insert(scope, source)

    def fingerprints(self, scope: Scope) -> dict[str | None, tuple[int, int]]:
        """Count and hash sum of the window now, per partition of a range."""
        columns = [c.stored_name for c in self._columns]
        if scope.cells:
            q, p = sql.partition_fingerprints(_target(scope), columns, scope.cells)
            return {k: (n, d) for k, n, d in self.conn.execute(q, p).fetchall()}
        q, p = sql.fingerprint(_target(scope), columns, scope.region)
        count, digest = _one(self.conn, q, p) or (0, 0)
        return {None: (count, digest)}

    def fingerprint_table(
        self,
        schema: str,
        table: str,
        partition_columns: PartitionColumns,
        window: WriteWindow | None,
    ) -> tuple[int, int] | None:
        """Count and hash sum of a table (or one window of it); ``None`` when it is absent."""
        cols = table_columns(self.conn, schema, table)
        if cols is None:
            return None
        region = region_of(window, partition_columns, lambda c: arrow_type(cols[c]), table)
        # The library's own table has a name no user table can have, so it skips that check.
        own = (schema, table) == (OWNERS_SCHEMA, OWNERS_TABLE)
        target = OWNERS if own else qualified(schema, table)
        q, p = sql.fingerprint(target, list(cols), region)
        count, digest = _one(self.conn, q, p) or (0, 0)
        return count, digest

    def load(
        self, settings: WriteSettings, window: WriteWindow | None, nothing: bool, arrow: bool
    ) -> pa.Table | pd.DataFrame:
        """The window's rows (the whole table without one), in partition order."""
        where, params, order = "", [], ""
        pcols = settings.partition_names
        if pcols:
            order = " ORDER BY " + ", ".join(quote(c) for c in pcols)
        if nothing:
            where = " WHERE false"
        elif window and pcols:
            cols = table_columns(self.conn, settings.schema, settings.table) or {}
            region = region_of(
                window, settings.partition_columns, lambda c: arrow_type(cols[c]), settings.table
            )
            pred, params = batch_sql.region_predicate(region)
            where = f" WHERE {pred}"
        target = qualified(settings.schema, settings.table)
        relation = self.conn.sql(f"SELECT * FROM {target}{where}{order}", params=params)
        return relation.to_arrow_table() if arrow else relation.df()


def _target(scope: Scope) -> str:
    return qualified(scope.settings.schema, scope.settings.table)


#: A timestamp unit's fractional second digits.
_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}


def _rounds(column: ColumnFit) -> bool:
    """Whether DuckDB stores ``column`` in a coarser timestamp unit (its cast rounds to it)."""
    sent, stored = column.type, column.stored_type
    return (
        pa.types.is_timestamp(sent)
        and pa.types.is_timestamp(stored)
        and _DIGITS[stored.unit] < _DIGITS[sent.unit]
    )


def claim_table(conn: duckdb.DuckDBPyConnection, schema: str, table: str, asset: str) -> None:
    """Record ``asset`` as the owner of ``schema.table`` (names compared without case)."""
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {OWNERS} (schema_key VARCHAR, table_key VARCHAR,"
        " asset_key VARCHAR NOT NULL, PRIMARY KEY (schema_key, table_key))"
    )
    conn.execute(f"INSERT INTO {OWNERS} VALUES (?, ?, ?)", [schema.lower(), table.lower(), asset])


def _database_failed(where: str) -> str:
    return (
        f"Publishing {where} failed inside the database. The write is one transaction, so the"
        " window holds its previous rows (or, if the commit reached the WAL before the failure,"
        " this whole batch), never a mix. Fix the cause named above, then rerun the partition:"
        " free disk space for 'No space left on device'; open the database read-write, or make"
        " the file writable, for 'read-only mode' or 'Permission denied'; let the other writer"
        " finish for a lock or a conflict."
    )
