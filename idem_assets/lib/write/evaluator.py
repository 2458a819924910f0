"""The embedded DuckDB that judges a staged Arrow batch, and the batch staged for it in Arrow.

Engines without a SQL engine of their own next to the batch (PostgreSQL's rows go to a server,
Delta Lake's and Iceberg's to files) stage the batch in Arrow with :func:`stored_rows` and let
the guards read it here: nothing reaches the target before every guard has passed.
"""

import os
import uuid
from collections.abc import Sequence
from typing import Any

import duckdb
import pyarrow as pa

from idem_assets.lib.model.identifiers import quote
from idem_assets.lib.sql.predicates import Statement
from idem_assets.lib.write.schema_fit import rounded_timestamps, stored_batch
from idem_assets.lib.write.seam import Fitted

#: Registered names are the library's own: not plain identifiers, so no user table has one.
BATCH_PREFIX = "idem-batch-"


class DuckDBEvaluator:
    """A DuckDB connection the guards query, holding what this publish registered in it."""

    dialect = "duckdb"

    def __init__(self, conn: duckdb.DuckDBPyConnection) -> None:
        """Query ``conn``; :meth:`release` unregisters what was registered through this."""
        self.conn = conn
        self._names: list[str] = []

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

    def release(self, failed: bool = False) -> None:
        """Unregister everything this evaluator registered (errors too, unless ``failed``)."""
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


def embedded() -> DuckDBEvaluator:
    """An evaluator on a cursor of the process's embedded DuckDB (close it with the cursor)."""
    global _PROCESS
    # Opening a database costs ~10 ms a publish; a cursor costs nothing. A forked child opens
    # its own.
    if _PROCESS is None or _PROCESS[0] != os.getpid():
        conn = duckdb.connect()
        # Aware timestamps in samples and messages read in UTC, as the engines store them.
        conn.execute("SET GLOBAL TimeZone = 'UTC'")
        _PROCESS = (os.getpid(), conn)
    return DuckDBEvaluator(_PROCESS[1].cursor())


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
