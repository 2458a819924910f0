"""The DuckDB backend: describes, stages, counts and writes a window in one DuckDB transaction.

What DuckDB does differently is all this module holds: its catalog, its type names and casts
(:mod:`.types`) and the one statement only DuckDB spells (``INSERT ... BY NAME``, :mod:`.sql`).
Every other statement is :mod:`idem_assets.lib.sql.statements`', rendered in DuckDB's dialect;
every decision is the core's (:mod:`idem_assets.lib.write`).

The staged batch is a view over the registered Arrow batch that casts it the way DuckDB stores
it, rounding timestamps to the column's unit, so the guards judge it in this same connection
without a copy; the core knows which columns round (``Capabilities.timestamps == "round"``), so
a value the rounding moves out of the window is refused with the floor that keeps it in.
"""

import contextlib
import functools
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

import duckdb
import pyarrow as pa

from idem_assets.lib.backends.duckdb import sql
from idem_assets.lib.backends.duckdb.types import DUCKDB_TYPES, arrow_type, cast_sql, duckdb_type
from idem_assets.lib.model.identifiers import qualified, quote
from idem_assets.lib.model.settings import WriteSettings
from idem_assets.lib.model.windows import WriteWindow, stored_region
from idem_assets.lib.sql import statements
from idem_assets.lib.sql.predicates import Statement
from idem_assets.lib.write.evaluator import DuckDBEvaluator
from idem_assets.lib.write.schema_fit import ColumnFit, change_sql
from idem_assets.lib.write.seam import (
    Capabilities,
    Counts,
    Fingerprints,
    Fitted,
    PartitionColumns,
    Progress,
    Scope,
    Snapshot,
    Staged,
    StoredColumn,
    Summary,
    TableRef,
    WritePlan,
    Written,
    selected_columns,
)
from idem_assets.lib.write.streams import (
    CHUNK_ROWS,
    SpillArea,
    Spilled,
    Stream,
    database_file,
    half,
    insert,
    memory_lent,
    plain,
    read_types,
    refuse_lost_types,
)

if TYPE_CHECKING:
    # Only the annotations name pandas: importing it costs a run worker about a second.
    import pandas as pd

#: The library's own names are not plain identifiers, so no asset, schema or column can be
#: given one (validate_identifier refuses them) and shadow or be shadowed by them.
STAGED_PREFIX = "idem-staged-"
BEFORE_PREFIX = "idem-before-"
OWNERS_SCHEMA = "main"
OWNERS_TABLE = "idem-table-owners"
OWNERS = f"{quote(OWNERS_SCHEMA)}.{quote(OWNERS_TABLE)}"
_OWNERS_NAME = (OWNERS_SCHEMA, OWNERS_TABLE)
#: The row id DuckDB gives the first row a transaction inserts into a table, and the rest count
#: up from (its MAX_ROW_ID), until the commit numbers them among the table's: a table's own
#: rows stay far below it. A transaction's UPDATE of an indexed column moves rows above it
#: too; a publish updates nothing. Checked once per process, and around every insert.
FIRST_NEW_ROWID = 36_028_797_018_960_000

CAPABILITIES = Capabilities(
    engine="DuckDB",
    types=DUCKDB_TYPES,
    commit="transaction",
    # DuckDB's cast rounds a finer timestamp to a coarser column's unit.
    timestamps="round",
    expression_dialect="duckdb",
    evaluator_reads_target=True,
    stages_in_place=True,
)


def table_columns(
    conn: duckdb.DuckDBPyConnection, schema: str, table: str
) -> dict[str, str] | None:
    """Column name to DuckDB type of an existing table, or ``None`` when there is no such table."""
    rows = conn.execute(sql.table_columns(), [schema, table]).fetchall()
    return {r[0]: r[1] for r in rows} if rows else None


class DuckDBBackend:
    """Publishes through one open DuckDB connection; the caller owns (and closes) it."""

    capabilities: ClassVar[Capabilities] = CAPABILITIES

    def __init__(self, conn: duckdb.DuckDBPyConnection) -> None:
        """Wrap ``conn``; nothing is read until a publish asks."""
        self.conn = conn

    @contextmanager
    def begin(self, where: str) -> Iterator["DuckDBTransaction"]:
        """BEGIN, then COMMIT, or ROLLBACK and name the database failure."""
        conn = self.conn
        tx = DuckDBTransaction(conn)
        failed = False
        try:
            conn.execute("BEGIN TRANSACTION")
            try:
                yield tx
                for view in tx.views:
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
            try:
                tx.evaluator.release(failed)
            finally:
                for undo in tx.afterwards:
                    # A fatal error invalidates the connection, and the setting with it.
                    with contextlib.suppress(duckdb.Error):
                        undo()

    def spill_area(self) -> SpillArea:
        """A streamed batch is staged in this connection, so the write copies it in the engine."""
        return SpillArea(self.conn, temporary=True, files=True)

    def fingerprint(
        self, table: TableRef, partition_columns: PartitionColumns, window: WriteWindow | None
    ) -> tuple[int, int] | None:
        """Count and hash sum of a table (or one window of it); ``None`` when it is absent."""
        cols = table_columns(self.conn, table.schema, table.table)
        if cols is None:
            return None
        region = stored_region(window, partition_columns, _arrow_types(cols), table.table)
        # The library's own table has a name no user table can have, so it skips that check.
        own = (table.schema, table.table) == _OWNERS_NAME
        target = _OWNERS_REL if own else (table.schema, table.table)
        found = DuckDBEvaluator(self.conn).one(statements.fingerprint(target, list(cols), region))
        count, digest = found or (0, 0)
        return count, digest

    def load(
        self,
        settings: WriteSettings,
        window: WriteWindow | None,
        nothing: bool = False,
        arrow: bool = True,
        columns: Sequence[str] | None = None,
        stream: bool = False,
    ) -> "pa.Table | pd.DataFrame | pa.RecordBatchReader | None":
        """The window's rows (the whole table without one), in partition order."""
        cols = table_columns(self.conn, settings.schema, settings.table)
        if cols is None:
            return None
        region = stored_region(
            None if nothing else window,
            settings.partition_columns,
            _arrow_types(cols),
            settings.table,
        )
        order = _spelt(settings.partition_names, cols)
        names = selected_columns(columns, cols)
        q, p = statements.select_window(
            (settings.schema, settings.table), names, region, order, nothing
        )
        relation = self.conn.sql(q, params=p)
        if stream:
            return relation.to_arrow_reader(CHUNK_ROWS)
        return relation.to_arrow_table() if arrow else relation.df()


_OWNERS_REL = _OWNERS_NAME


def _arrow_types(cols: dict[str, str]) -> dict[str, pa.DataType]:
    return {c: arrow_type(t) for c, t in cols.items()}


def _spelt(names: tuple[str, ...], cols: dict[str, str]) -> list[str]:
    by_lower = {c.lower(): c for c in cols}
    return [by_lower.get(n.lower(), n) for n in names]


class DuckDBTransaction:
    """One publish on the connection: its evaluator is the connection itself."""

    def __init__(self, conn: duckdb.DuckDBPyConnection) -> None:
        """Work on ``conn`` inside the transaction the backend began."""
        self.conn = conn
        self.evaluator = DuckDBEvaluator(conn)
        self.views: list[str] = []
        self.committed: dict[str, Any] = {}
        #: The table's columns as the catalog spells their types (empty: no table yet).
        self.catalog: dict[str, str] = {}
        #: The rows a streamed batch inserted into its table (:meth:`stage_in_place`), if any.
        self.in_place: int | None = None
        #: What puts the connection's settings back once the transaction has ended.
        self.afterwards: list[Callable[[], None]] = []
        self._before: str | None = None

    def describe(self, settings: WriteSettings) -> Snapshot:
        """One catalog scan for the table's columns and the owners table."""
        s = settings
        rows = self.evaluator.rows(
            Statement(
                sql.describe(), [OWNERS_TABLE, OWNERS_SCHEMA, s.schema, s.table, *_OWNERS_NAME]
            )
        )
        self.catalog = {name: kind for own, name, kind in rows if not own}
        columns = {
            name: StoredColumn(arrow_type(kind), kind) for name, kind in self.catalog.items()
        }
        owner = None
        if any(own for own, _, _ in rows):
            found = self.evaluator.rows(
                Statement(
                    f"SELECT asset_key FROM {OWNERS} WHERE schema_key = $1 AND table_key = $2",
                    [s.schema.lower(), s.table.lower()],
                )
            )
            owner = found[0][0] if found else None
        return Snapshot(
            table=TableRef.of(s),
            columns=columns or None,
            owner=owner,
            handover=(
                f"UPDATE {OWNERS} SET asset_key = '{{asset}}' WHERE schema_key ="
                f" '{s.schema.lower()}' AND table_key = '{s.table.lower()}'"
            ),
        )

    def stage_in_place(
        self, stream: Stream, settings: WriteSettings, memory: str, progress: Progress
    ) -> Spilled | None:
        """The stream inserted into its table, where DuckDB stores each column as it reads it.

        The guards read those rows by their row ids, the summary counts the table's own rows
        apart from them, and the write only deletes the old ones: the batch is written once.
        Only a batch of exactly the table's columns, spelt and typed as stored, so the insert
        casts nothing and each view gives the rows back under the stream's names, into a table
        with no constraint (a key or NOT NULL the insert would check before the guards, and
        fail against the old rows) nor a column of its own named ``rowid``. A table to
        create, a column to add or cast, or a merge that deduplicates keeps the staged copy
        (``None``), as does a DuckDB that numbers new rows otherwise.
        """
        s = settings
        if s.mode == "merge" and s.dedupe_order_by:
            return None
        stored = table_columns(self.conn, s.schema, s.table)
        if stored is None or "rowid" in {name.lower() for name in stored}:
            return None
        if read_types(stream, self.conn) != stored or not numbers_new_rows(FIRST_NEW_ROWID):
            return None
        bound = self.conn.execute(sql.constraints(), [s.schema, s.table]).fetchall()[0][0]
        target = qualified(s.schema, s.table)
        if bound or self._new_rows(target):
            return None
        self.afterwards.append(_order_free(self.conn))
        self.afterwards.append(_cache_halved(self.conn, memory))
        rows, seconds = insert(stream, self.conn, target, progress)
        if self._new_rows(target) != rows:
            raise RuntimeError(
                f"DuckDB {duckdb.__version__} numbered the {rows:,} rows this publish inserted into"
                f" {target} other than from row id {FIRST_NEW_ROWID}, which the guards read them"
                " by. Nothing was changed (the transaction is rolled back). Fix: return the"
                " batch as a pyarrow Table (reader.read_all()), which is published without"
                " that numbering, and report the DuckDB version to idem_assets."
            )
        name = STAGED_PREFIX + uuid.uuid4().hex
        names = ", ".join(quote(c) for c in stream.schema.names)
        self.conn.execute(
            f"CREATE TEMP VIEW {quote(name)} AS SELECT {names} FROM {target}"
            f" WHERE rowid >= {FIRST_NEW_ROWID}"
        ).fetchall()
        self.views.append(quote(name))
        self.in_place = rows
        staged = Spilled(
            SpillArea(self.conn, temporary=True), name, plain(stream.schema), rows, memory
        )
        refuse_lost_types(staged)
        progress(f"Staged {rows:,} rows in {seconds:.1f} s (DuckDB, {memory}, in {target} itself).")
        return staged

    def _new_rows(self, target: str) -> int:
        """Rows of ``target`` numbered as this transaction's own inserts."""
        found = self.conn.execute(
            f"SELECT count(*) FROM {target} WHERE rowid >= {FIRST_NEW_ROWID}"
        ).fetchall()
        return int(found[0][0])

    def _stored(self, scope: Scope) -> tuple[str, str] | str:
        """The table's own rows: the table, or a view leaving out the batch staged in it."""
        if self.in_place is None:
            return _target(scope)
        if self._before is None:
            self._before = BEFORE_PREFIX + uuid.uuid4().hex
            self.conn.execute(
                f"CREATE TEMP VIEW {quote(self._before)} AS SELECT * FROM"
                f" {qualified(*_target(scope))} WHERE rowid < {FIRST_NEW_ROWID}"
            ).fetchall()
            self.views.append(quote(self._before))
        return self._before

    def stage(self, batch: pa.Table | Spilled, fitted: Fitted) -> Staged:
        """Register the batch and, where a type or name differs, a view casting it as stored.

        A streamed batch is already a table of this connection (:meth:`DuckDBBackend.spill_area`).
        """
        raw = batch.relation if isinstance(batch, Spilled) else self.evaluator.register(batch)
        stored = {c.stored_name: self._stored_sql(c, fitted) for c in fitted.columns}
        expressions = [(c, _stored_expression(c, stored[c.stored_name])) for c in fitted.columns]
        source = raw
        if any(e != quote(c.stored_name) for c, e in expressions):
            selects = ", ".join(f"{e} AS {quote(c.stored_name)}" for c, e in expressions)
            name = quote(STAGED_PREFIX + uuid.uuid4().hex)
            # A temporary view, dropped by the rollback or before the commit.
            self.conn.execute(f"CREATE TEMP VIEW {name} AS SELECT {selects} FROM {raw}")
            source = name
            self.views.append(name)
        return Staged(relation=source, evaluator=self.evaluator, sent=raw)

    def _stored_sql(self, column: ColumnFit, fitted: Fitted) -> str:
        """The stored column's DuckDB type: the catalog's, or the one it takes once changed."""
        changed = {c.column for c in fitted.changes}
        if column.stored_name in self.catalog and column.stored_name not in changed:
            return self.catalog[column.stored_name]
        return DUCKDB_TYPES.type_sql(column.stored_type)

    def summarize(self, scope: Scope, final: bool = False) -> Summary:
        """Rows the window holds now, and for a merge its keys' rows in and outside it."""
        if not scope.table_exists:
            return Summary()
        ev, target = self.evaluator, self._stored(scope)
        if scope.cells:
            existing: Counts = dict(ev.rows(statements.count_by_partition(target, scope.cells)))
        else:
            existing = {None: (ev.one(statements.count_window(target, scope.region)) or (0,))[0]}
        if scope.settings.mode != "merge":
            return Summary(existing=existing)
        source, key = _source(scope), scope.key
        if scope.cells:
            matched: Counts = dict(
                ev.rows(statements.matched_by_partition(target, source, key, scope.cells))
            )
            elsewhere = matched.pop(None, 0)
        else:
            in_window, elsewhere = ev.one(
                statements.merge_counts(target, source, key, scope.region)
            ) or (0, 0)
            matched = {None: in_window}
        sample = None
        if elsewhere and scope.pcols:
            sample = ev.arrow(
                statements.keys_outside_window_sample(target, source, key, scope.region)
            )
        return Summary(existing=existing, matched=matched, elsewhere=elsewhere, sample=sample)

    def write(self, plan: WritePlan, on_stage: Callable[[str], None]) -> Written:
        """Create, claim, change the schema, replace or merge the window, then fingerprint it."""
        if self.in_place is not None:
            return self._write_in_place(plan, on_stage)
        scope = plan.scope
        settings, target, conn = scope.settings, _target(scope), self.conn
        if plan.claim:
            claim_table(conn, settings.schema, settings.table, settings.asset)
        for change in scope.fitted.changes:
            conn.execute(
                change_sql(qualified(settings.schema, settings.table), change, DUCKDB_TYPES)
            )
        if plan.create:
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(settings.schema)}")
            conn.execute(
                f"CREATE TABLE {qualified(settings.schema, settings.table)} AS SELECT * FROM"
                f" {scope.staged.relation} LIMIT 0"
            )
        source = scope.staged.relation
        if settings.mode == "overwrite" or settings.delete_missing:
            if scope.region:
                self.evaluator.rows(statements.delete_window(target, scope.region))
            else:
                self.evaluator.rows(statements.delete_all(target))
        else:
            self.evaluator.rows(statements.delete_matching_keys(target, _source(scope), scope.key))
        on_stage("deleted")
        if settings.mode == "merge" and settings.dedupe_order_by:
            names = [c.stored_name for c in scope.fitted.columns]
            q, _ = statements.dedupe(_source(scope), scope.key, settings.dedupe_order_by, names)
            source = f"({q})"
        order_by = scope.pcols if scope.cells else ()
        # DuckDB answers an INSERT with the number of rows it wrote: after dedup, the batch's.
        rows = self.evaluator.one(
            sql.insert_by_name(qualified(settings.schema, settings.table), source, order_by)
        )[0]
        return Written(rows=rows, fingerprints=self._fingerprints(scope))

    def _write_in_place(self, plan: WritePlan, on_stage: Callable[[str], None]) -> Written:
        """Claim the table, then delete the old rows the batch inserted beside them replaces."""
        scope = plan.scope
        settings, target = scope.settings, _target(scope)
        if plan.create or scope.fitted.changes:
            raise AssertionError("a batch staged in its table needs no table or column made")
        if plan.claim:
            claim_table(self.conn, settings.schema, settings.table, settings.asset)
        if settings.mode == "overwrite" or settings.delete_missing:
            if scope.region:
                old = statements.delete_window(target, scope.region)
            else:
                old = statements.delete_all(target)
        else:
            old = statements.delete_matching_keys(target, _source(scope), scope.key)
        self.evaluator.rows(sql.fenced(old, FIRST_NEW_ROWID))
        on_stage("deleted")
        return Written(rows=self.in_place or 0, fingerprints=self._fingerprints(scope))

    def _fingerprints(self, scope: Scope) -> Fingerprints:
        """Count and hash sum of the window now, per partition of a range."""
        names = [c.stored_name for c in scope.fitted.columns]
        if scope.cells:
            found = self.evaluator.rows(
                statements.partition_fingerprints(_target(scope), names, scope.cells)
            )
            return {k: (n, d) for k, n, d in found}
        count, digest = self.evaluator.one(
            statements.fingerprint(_target(scope), names, scope.region)
        ) or (0, 0)
        return {None: (count, digest)}


@functools.cache
def numbers_new_rows(first: int) -> bool:
    """Whether this DuckDB numbers a transaction's new rows from ``first`` until they commit."""
    with duckdb.connect() as conn:
        conn.execute("CREATE TABLE probe (n INTEGER)").fetchall()
        conn.execute("INSERT INTO probe VALUES (1)").fetchall()
        conn.execute("BEGIN TRANSACTION").fetchall()
        conn.execute("INSERT INTO probe VALUES (2), (3)").fetchall()
        found = conn.execute(
            f"SELECT min(rowid), count(*) FROM probe WHERE rowid >= {int(first)}"
        ).fetchall()
        conn.execute("ROLLBACK").fetchall()
    return found == [(first, 2)]


def _cache_halved(conn: duckdb.DuckDBPyConnection, memory: str) -> Callable[[], None]:
    """Hold ``conn`` to half of ``memory`` for the rest of the publish; what gives it back.

    The stream goes into the table's own blocks on disk as it is read, and the guards and the
    write read them once each: DuckDB would keep them cached up to the whole limit, which makes
    a big day's publish take more memory than a small one's and none of it faster (a 20M-row
    day: the same time, 130 MB less; docs/streaming.md). A quarter of it is slower. A database
    in memory keeps the whole limit: there the table's blocks are the memory itself.
    """
    held = contextlib.ExitStack()
    if database_file(conn) is None:
        return held.close
    held.enter_context(memory_lent(conn, memory, half(memory)))
    return held.close


def _order_free(conn: duckdb.DuckDBPyConnection) -> Callable[[], None]:
    """Let ``conn`` insert rows out of the stream's order; what puts its setting back.

    Keeping the order holds row groups back until the ones before are written (DuckDB's advice
    for loads under a memory limit is to turn it off): 20M rows took 6.9 s kept, 4.5 s free.
    A table's row order is no promise (loads order by partition, fingerprints are sums). The
    setting is this connection's own (SESSION); it goes back once the transaction has ended,
    as a failed statement leaves the transaction refusing every other until its rollback.
    """
    shown = "SELECT current_setting('preserve_insertion_order')"
    before = conn.execute(shown).fetchall()[0][0]
    conn.execute("SET SESSION preserve_insertion_order = false").fetchall()

    def back() -> None:
        conn.execute("RESET SESSION preserve_insertion_order").fetchall()
        if conn.execute(shown).fetchall()[0][0] != before:
            # The connection had a value of its own: put that back, not the database's.
            conn.execute(f"SET SESSION preserve_insertion_order = {bool(before)}").fetchall()

    return back


def _stored_expression(column: ColumnFit, stored_sql: str) -> str:
    """The batch value as it will be stored: cast (and rounded) by DuckDB."""
    return cast_sql(quote(column.name), duckdb_type(column.type), stored_sql)


def _target(scope: Scope) -> tuple[str, str]:
    return (scope.settings.schema, scope.settings.table)


def _source(scope: Scope) -> str:
    """The staged relation as the statements take it (its name unquoted)."""
    return scope.staged.relation.strip('"')


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
