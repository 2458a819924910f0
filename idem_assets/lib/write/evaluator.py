"""The embedded DuckDB that judges a staged Arrow batch, and the batch staged for it in Arrow.

Engines without a SQL engine of their own next to the batch (PostgreSQL's rows go to a server,
Delta Lake's and Iceberg's to files) stage the batch in Arrow with :func:`stored_rows` and let
the guards read it here: nothing reaches the target before every guard has passed.
"""

import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from idem_assets.lib.model.identifiers import quote
from idem_assets.lib.sql.predicates import Statement
from idem_assets.lib.write.schema_fit import rounded_timestamps, stored_batch
from idem_assets.lib.write.seam import Fitted, Progress, no_progress
from idem_assets.lib.write.streams import CHUNK_ROWS, Ticker, cast_reader, spill_root

#: Registered names are the library's own: not plain identifiers, so no user table has one.
BATCH_PREFIX = "idem-batch-"
STORED_PREFIX = "idem-stored-"
VIEW_PREFIX = "idem-view-"


class DuckDBEvaluator:
    """A DuckDB connection the guards query, holding what this publish registered in it."""

    dialect = "duckdb"

    def __init__(self, conn: duckdb.DuckDBPyConnection) -> None:
        """Query ``conn``; :meth:`release` unregisters what was registered through this."""
        self.conn = conn
        self._names: list[str] = []
        self._tables: list[str] = []
        self._views: list[str] = []

    def register(self, data: object, prefix: str = BATCH_PREFIX) -> str:
        """Register Arrow ``data`` (a table, reader or dataset); returns its quoted name."""
        # Unique per publish: cursors of one connection share its registered names.
        name = prefix + uuid.uuid4().hex
        self.conn.register(name, data)
        self._names.append(name)
        return quote(name)

    def rows(self, statement: Statement | str) -> list[tuple[Any, ...]]:
        """Run ``statement`` and fetch every row."""
        query, params = (statement, []) if isinstance(statement, str) else statement
        # Fetch to the end: DuckDB 2 refuses other work on a connection with an open result.
        return self.conn.execute(query, list(params)).fetchall()

    def one(self, statement: Statement | str) -> tuple[Any, ...]:
        """The statement's first row (an empty tuple when there is none)."""
        found = self.rows(statement)
        return found[0] if found else ()

    def arrow(self, statement: Statement | str) -> pa.Table:
        """Run ``statement`` and fetch its rows as Arrow."""
        query, params = (statement, []) if isinstance(statement, str) else statement
        return self.conn.sql(query, params=list(params) or None).to_arrow_table()

    def reader(self, statement: Statement | str) -> pa.RecordBatchReader:
        """Run ``statement`` and read its rows batch by batch (the cursor is busy until drained)."""
        query, params = (statement, []) if isinstance(statement, str) else statement
        return self.conn.sql(query, params=list(params) or None).to_arrow_reader(CHUNK_ROWS)

    def create(
        self, rows: pa.RecordBatchReader | str | Statement, prefix: str = STORED_PREFIX
    ) -> str:
        """A table of the database holding ``rows``, dropped on release; its quoted name.

        ``rows`` is a reader (read once) or a query (with its values).
        """
        name = prefix + uuid.uuid4().hex
        params: Sequence[Any] = ()
        if isinstance(rows, Statement):
            source, params = f"({rows.sql})", rows.params
        else:
            source = f"({rows})" if isinstance(rows, str) else self.register(rows)
        create = f"CREATE TABLE {quote(name)} AS SELECT * FROM {source}"
        self.conn.execute(create, list(params)).fetchall()
        self._tables.append(name)
        return quote(name)

    def view(self, query: str | Statement) -> str:
        """A temporary view of ``query`` on this evaluator's cursor, dropped on release."""
        sql, params = (query, []) if isinstance(query, str) else query
        name = VIEW_PREFIX + uuid.uuid4().hex
        self.conn.execute(f"CREATE TEMP VIEW {quote(name)} AS {sql}", list(params)).fetchall()
        self._views.append(name)
        return quote(name)

    def release(self, failed: bool = False) -> None:
        """Unregister everything this evaluator registered (errors too, unless ``failed``)."""
        views, tables = self._views, self._tables
        self._views, self._tables = [], []
        for name in views:
            try:
                self.conn.execute(f"DROP VIEW IF EXISTS {quote(name)}").fetchall()
            except duckdb.Error:
                # A write that failed midway may leave a result open on this cursor; its
                # temporary views go with the cursor when it closes.
                if not failed:
                    raise
        if tables:
            # A table it created is the database's: dropped through a cursor of its own, which
            # no open result of this one can refuse, or it would outlive the publish.
            with self.conn.cursor() as fresh:
                for name in tables:
                    try:
                        fresh.execute(f"DROP TABLE IF EXISTS {quote(name)}").fetchall()
                    except duckdb.Error:
                        if not failed:
                            raise
        names, self._names = self._names, []
        for name in names:
            try:
                self.conn.unregister(name)
            except duckdb.Error:
                # A fatal error invalidates the connection: the error that got here is the one
                # to report.
                if not failed:
                    raise


_PROCESS: tuple[int, duckdb.DuckDBPyConnection] | None = None


def reading(
    query: Callable[["DuckDBEvaluator"], Statement | str], schema: pa.Schema | None = None
) -> pa.RecordBatchReader:
    """The rows of ``query`` on an embedded evaluator of their own, which lives until they end.

    ``query`` may register or create what it reads (the evaluator drops it at the end); the
    rows come back in ``schema`` when given. For a load that hands a reader to its caller.
    """
    ev = embedded()
    try:
        found = ev.reader(query(ev))
    except BaseException:
        ev.release(failed=True)
        ev.conn.close()
        raise

    def batches() -> Iterator[pa.RecordBatch]:
        try:
            yield from found
        finally:
            found.close()
            ev.release(failed=True)
            ev.conn.close()

    return cast_reader(pa.RecordBatchReader.from_batches(found.schema, batches()), schema)


def embedded() -> DuckDBEvaluator:
    """An evaluator on a cursor of the process's embedded DuckDB (close it with the cursor)."""
    return DuckDBEvaluator(embedded_database().cursor())


def embedded_database() -> duckdb.DuckDBPyConnection:
    """The process's embedded DuckDB: an in-memory database every cursor of it shares."""
    global _PROCESS
    # Opening a database costs ~10 ms a publish; a cursor costs nothing. A forked child opens
    # its own.
    if _PROCESS is None or _PROCESS[0] != os.getpid():
        conn = duckdb.connect()
        # Aware timestamps in samples and messages read in UTC, as the engines store them.
        conn.execute("SET GLOBAL TimeZone = 'UTC'")
        # Past its memory limit an in-memory database writes to this folder (by default a
        # '.tmp' in the working directory, which may be the user's project).
        folder = str(spill_root() / "duckdb").replace("'", "''")
        conn.execute(f"SET GLOBAL temp_directory = '{folder}'")
        _PROCESS = (os.getpid(), conn)
    return _PROCESS[1]


class StagedRows:
    """The batch as an engine storing Arrow stores it, and where the guards read it.

    In memory (an Arrow table registered in the evaluator) or, for a streamed batch, a table
    of the embedded DuckDB that spills to disk: the write reads it :meth:`whole` or as a
    :meth:`reader`, batch by batch.
    """

    def __init__(
        self,
        evaluator: DuckDBEvaluator,
        relation: str,
        schema: pa.Schema,
        num_rows: int,
        table: pa.Table | None = None,
    ) -> None:
        """Rows of ``schema`` read by ``relation`` in ``evaluator``; ``table`` when in memory."""
        self.evaluator = evaluator
        self.relation = relation
        self.schema = schema
        self.num_rows = num_rows
        self._table = table

    @property
    def streamed(self) -> bool:
        """Whether the rows live in a DuckDB table rather than in memory."""
        return self._table is None

    def whole(self) -> pa.Table:
        """Every row in memory (a streamed batch is read whole: only for engines that must)."""
        if self._table is not None:
            return self._table
        return self.reader().read_all()

    def reader(self, relation: str | None = None) -> pa.RecordBatchReader:
        """The rows (or those of ``relation``, a view over them), batch by batch, as stored."""
        if self._table is not None and relation in (None, self.relation):
            return self._table.to_reader()
        found = self.evaluator.reader(f"SELECT * FROM {relation or self.relation}")
        return cast_reader(found, self.schema)


class Counted:
    """A reader whose rows are counted as its consumer reads them, reporting now and then."""

    def __init__(
        self,
        reader: pa.RecordBatchReader,
        progress: Progress = no_progress,
        engine: str = "",
        total: int | None = None,
    ) -> None:
        """Count the rows of ``reader`` as ``engine`` reads them (``total`` of them, if known)."""
        self.rows = 0
        self._reader = reader
        self._progress, self._engine, self._total = progress, engine, total

    def reader(self) -> pa.RecordBatchReader:
        """The rows, counted on the way through."""
        return pa.RecordBatchReader.from_batches(self._reader.schema, self._batches())

    def _batches(self) -> Iterator[pa.RecordBatch]:
        ticker = Ticker()
        for batch in self._reader:
            self.rows += batch.num_rows
            seconds = ticker.due()
            if seconds is not None:
                of = "" if self._total is None else f" of {self._total:,}"
                self._progress(
                    f"Writing: {self.rows:,}{of} rows sent to {self._engine} in {seconds:.0f} s."
                )
            yield batch


def staged_rows(evaluator: DuckDBEvaluator, batch: pa.Table | Any, fitted: Fitted) -> StagedRows:
    """``batch`` as stored (:func:`stored_rows`), registered in ``evaluator`` for the guards.

    A streamed batch (:class:`~idem_assets.lib.write.streams.Spilled`, in the embedded DuckDB)
    is read once more, a bounded table at a time, into a table of the stored names and types;
    one already stored as the table stores it is used as it is.
    """
    from idem_assets.lib.write.streams import Spilled

    if not isinstance(batch, Spilled):
        rows = stored_rows(batch, fitted)
        return StagedRows(evaluator, evaluator.register(rows), rows.schema, rows.num_rows, rows)
    order = list(fitted.order)
    fits = fitted.columns
    same = all(f.name == f.stored_name and f.type == f.stored_type for f in fits)
    if same and not fitted.rounds and batch.schema.names == order:
        return StagedRows(evaluator, batch.relation, batch.schema, batch.num_rows)
    first = stored_rows(pa.Table.from_batches([], batch.schema), fitted)
    converted = (b for chunk in batch.chunks() for b in stored_rows(chunk, fitted).to_batches())
    relation = evaluator.create(pa.RecordBatchReader.from_batches(first.schema, converted))
    return StagedRows(evaluator, relation, first.schema, batch.num_rows)


def stored_rows(batch: pa.Table, fitted: Fitted) -> pa.Table:
    """The batch as an engine storing it in Arrow stores it: names, types, order, rounding.

    Timestamps are floored to the stored unit, then rounded where the engine rounds to fewer
    digits (:attr:`Fitted.rounds`), so the staged values are exactly the stored ones.
    """
    fits = fitted.columns
    unchanged = all(f.name == f.stored_name and f.type == f.stored_type for f in fits)
    stored = batch if unchanged else stored_batch(batch, fits)
    for r in fitted.rounds:
        at = stored.schema.get_field_index(r.stored_name)
        stored = stored.set_column(
            at, r.stored_name, rounded_timestamps(stored.column(at), r.digits)
        )
    order: Sequence[str] = fitted.order
    if list(stored.column_names) != list(order):
        stored = stored.select(list(order))
    return stored
