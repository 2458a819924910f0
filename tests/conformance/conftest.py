"""The backends under test: one factory each. A new engine is done when it passes this suite.

A factory takes a fresh directory and returns a :class:`Store`: how to open the engine's backend,
its two IO managers, and how to read a table back. Add Postgres or Delta Lake by adding one
factory to ``FACTORIES``.
"""

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import duckdb
import pytest
from deltalake import DeltaTable

import idem_assets as ia
from idem_assets.lib.backends.delta import DAY_COLUMN, DeltaBackend, delta_tables, owner_of
from idem_assets.lib.backends.duckdb import DuckDBBackend
from idem_assets.lib.backends.protocol import Backend


@dataclass(frozen=True)
class Store:
    """One engine's store for one test: its backend, its IO managers and a reader."""

    name: str
    open: Callable[[], AbstractContextManager[Backend]]
    overwrite: Callable[[], dg.ConfigurableIOManager]
    merge: Callable[[], dg.ConfigurableIOManager]
    #: Every row of ``main.<table>``, sorted.
    rows: Callable[[str], list[tuple]]
    #: Every table of the store (the owners record too) with its fingerprint.
    snapshot: Callable[[], dict[str, str | None]]

    def resources(self) -> dict[str, dg.ConfigurableIOManager]:
        """The IO manager keys the suite's assets use."""
        return {"io_manager": self.overwrite(), "merge_io_manager": self.merge()}


def duckdb_store(directory: Path) -> Store:
    """The DuckDB backend on a database file."""
    database = str(directory / "warehouse.duckdb")

    @contextmanager
    def open_backend() -> Iterator[Backend]:
        conn = duckdb.connect(database)
        try:
            yield DuckDBBackend(conn)
        finally:
            conn.close()

    def rows(table: str) -> list[tuple]:
        with duckdb.connect(database, read_only=True) as conn:
            return sorted(conn.execute(f'SELECT * FROM main."{table}"').fetchall())

    def snapshot() -> dict[str, str | None]:
        with duckdb.connect(database, read_only=True) as conn:
            tables = conn.execute(
                "SELECT schema_name, table_name FROM duckdb_tables() ORDER BY ALL"
            ).fetchall()
            return {f"{s}.{t}": ia.table_fingerprint(conn, s, t) for s, t in tables}

    return Store(
        name="duckdb",
        open=open_backend,
        overwrite=lambda: ia.DuckDBOverwriteIOManager(database=database),
        merge=lambda: ia.DuckDBMergeIOManager(database=database),
        rows=rows,
        snapshot=snapshot,
    )


def delta_store(directory: Path) -> Store:
    """The Delta Lake backend on a directory of tables."""
    root = str(directory / "lake")

    @contextmanager
    def open_backend() -> Iterator[Backend]:
        with DeltaBackend(root) as backend:
            yield backend

    def rows(table: str) -> list[tuple]:
        stored = DeltaTable(f"{root}/main/{table}").to_pyarrow_table()
        stored = stored.drop_columns([c for c in stored.column_names if c == DAY_COLUMN])
        return sorted(zip(*stored.to_pydict().values(), strict=True))

    def snapshot() -> dict[str, str | None]:
        # The owner is the table's name: it is part of each table's record.
        found: dict[str, str | None] = {}
        with DeltaBackend(root) as backend:
            for schema, table in delta_tables(root):
                owner = owner_of(DeltaTable(backend.uri(schema, table)))
                fingerprint = ia.table_fingerprint(backend, schema, table)
                found[f"{schema}.{table}"] = f"{fingerprint} {owner}"
        return found

    return Store(
        name="delta",
        open=open_backend,
        overwrite=lambda: ia.DeltaOverwriteIOManager(root=root),
        merge=lambda: ia.DeltaMergeIOManager(root=root),
        rows=rows,
        snapshot=snapshot,
    )


FACTORIES: dict[str, Callable[[Path], Store]] = {"duckdb": duckdb_store, "delta": delta_store}


@pytest.fixture(params=sorted(FACTORIES))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A fresh store of each backend in turn."""
    return FACTORIES[request.param](tmp_path)
