"""The backends under test: one factory each. A new engine is done when it passes this suite.

A factory takes the test's request and a fresh directory and returns a :class:`Store`: how to
open the engine's backend, its two IO managers, and how to read a table back. Add an engine by
adding one factory to ``FACTORIES``.
"""

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import duckdb
import pytest

import idem_assets as ia
from idem_assets.lib.backends.duckdb import DuckDBBackend
from idem_assets.lib.backends.postgres import PostgresBackend, PostgresLocation
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


def duckdb_store(request: pytest.FixtureRequest, directory: Path) -> Store:
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


#: The environment variable the Postgres IO managers read the test server's password from.
PASSWORD_ENV = "IDEM_TEST_PG_PASSWORD"


def postgres_store(request: pytest.FixtureRequest, directory: Path) -> Store:
    """The Postgres backend on a fresh database of the session's server."""
    location: PostgresLocation = request.getfixturevalue("postgres_location")
    request.getfixturevalue("monkeypatch").setenv(PASSWORD_ENV, str(location.password))
    config = {
        "host": location.host,
        "port": location.port,
        "user": location.user,
        "database": location.database,
        "password_env": PASSWORD_ENV,
    }

    def rows(table: str) -> list[tuple]:
        with PostgresBackend.connect(location) as backend:
            backend.cur.execute(f'SELECT * FROM main."{table}"')
            return sorted(backend.cur.fetchall())

    def snapshot() -> dict[str, str | None]:
        with PostgresBackend.connect(location) as backend:
            backend.cur.execute(
                "SELECT schemaname, tablename FROM pg_tables WHERE schemaname NOT IN"
                " ('pg_catalog', 'information_schema') ORDER BY 1, 2"
            )
            tables = backend.cur.fetchall()
            return {f"{s}.{t}": ia.table_fingerprint(backend, s, t) for s, t in tables}

    return Store(
        name="postgres",
        open=lambda: PostgresBackend.connect(location),
        overwrite=lambda: ia.PostgresOverwriteIOManager(**config),
        merge=lambda: ia.PostgresMergeIOManager(**config),
        rows=rows,
        snapshot=snapshot,
    )


FACTORIES: dict[str, Callable[[pytest.FixtureRequest, Path], Store]] = {
    "duckdb": duckdb_store,
    "postgres": postgres_store,
}


@pytest.fixture(params=sorted(FACTORIES))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A fresh store of each backend in turn."""
    return FACTORIES[request.param](request, tmp_path)
