"""The backends under test: one factory each. A new engine is done when it passes this suite.

A factory takes the test's request and a fresh directory and returns a :class:`Store`: how to
open the engine's backend, its two IO managers, and how to read a table back. Add an engine by
adding one factory to ``FACTORIES``.
"""

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import pytest
from deltalake import DeltaTable

import idem_assets as ia
from idem_assets.lib.backends.delta.backend import DeltaBackend
from idem_assets.lib.backends.delta.layout import DAY_COLUMN, delta_tables, owner_of
from idem_assets.lib.backends.duckdb.backend import DuckDBBackend
from idem_assets.lib.backends.iceberg.backend import IcebergBackend
from idem_assets.lib.backends.iceberg.catalog import IcebergLocation
from idem_assets.lib.backends.iceberg.commit import OWNER_PROPERTY
from idem_assets.lib.backends.iceberg.io_managers import (
    IcebergMergeIOManager,
    IcebergOverwriteIOManager,
)
from idem_assets.lib.backends.postgres.backend import PostgresBackend, PostgresLocation
from idem_assets.lib.write.seam import Backend


@dataclass(frozen=True)
class Store:
    """One engine's store for one test: its backend, its IO managers and a reader."""

    name: str
    #: Opens the engine's backend; picklable, so a racing child process can open its own.
    open: Callable[[], AbstractContextManager[Backend]]
    #: The IO managers' fields: with ``name``, all a child process needs to rebuild them.
    config: Mapping[str, Any]
    #: Every row of ``main.<table>``, sorted.
    rows: Callable[[str], list[tuple]]
    #: Every table of the store (the owners record too) with its fingerprint.
    snapshot: Callable[[], dict[str, str | None]]
    #: Environment the IO managers read (a password), for a child process to set.
    env: Mapping[str, str] = field(default_factory=dict)

    def resources(self) -> dict[str, dg.ConfigurableIOManager]:
        """The IO manager keys the suite's assets use."""
        return io_managers(self.name, self.config)


#: Each engine's overwrite and merge IO manager classes.
IO_MANAGERS: dict[str, tuple[type[dg.ConfigurableIOManager], type[dg.ConfigurableIOManager]]] = {
    "delta": (ia.DeltaOverwriteIOManager, ia.DeltaMergeIOManager),
    "duckdb": (ia.DuckDBOverwriteIOManager, ia.DuckDBMergeIOManager),
    "postgres": (ia.PostgresOverwriteIOManager, ia.PostgresMergeIOManager),
    "iceberg": (IcebergOverwriteIOManager, IcebergMergeIOManager),
    "iceberg-postgres": (IcebergOverwriteIOManager, IcebergMergeIOManager),
    "spark": (ia.SparkOverwriteIOManager, ia.SparkMergeIOManager),
}


def io_managers(name: str, config: Mapping[str, Any]) -> dict[str, dg.ConfigurableIOManager]:
    """Engine ``name``'s IO managers under the keys the suite's assets use."""
    overwrite, merge = IO_MANAGERS[name]
    return {"io_manager": overwrite(**config), "merge_io_manager": merge(**config)}


@contextmanager
def duckdb_backend(database: str) -> Iterator[Backend]:
    """The DuckDB backend on one plain connection to ``database``, closed after."""
    conn = duckdb.connect(database)
    try:
        yield DuckDBBackend(conn)
    finally:
        conn.close()


@contextmanager
def delta_backend(root: str) -> Iterator[Backend]:
    """The Delta Lake backend on ``root``, closed after."""
    with DeltaBackend(root) as backend:
        yield backend


def duckdb_store(request: pytest.FixtureRequest, directory: Path) -> Store:
    """The DuckDB backend on a database file."""
    database = str(directory / "warehouse.duckdb")

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
        open=partial(duckdb_backend, database),
        config={"database": database},
        rows=rows,
        snapshot=snapshot,
    )


def delta_store(request: pytest.FixtureRequest, directory: Path) -> Store:
    """The Delta Lake backend on a directory of tables."""
    root = str(directory / "lake")

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
        open=partial(delta_backend, root),
        config={"root": root},
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
        open=partial(PostgresBackend.connect, location),
        config=config,
        rows=rows,
        snapshot=snapshot,
        env={PASSWORD_ENV: str(location.password)},
    )


@contextmanager
def spark_backend(spark_conf: Mapping[str, str], warehouse: str) -> Iterator[Backend]:
    """The Spark backend on the process's session (this worker's, or a child's own)."""
    from idem_assets.lib.backends.spark.backend import SparkBackend
    from idem_assets.lib.backends.spark.session import spark_session

    with SparkBackend(spark_session(dict(spark_conf)), warehouse) as backend:
        yield backend


def spark_store(request: pytest.FixtureRequest, directory: Path) -> Store:
    """The Spark backend on the worker's one session, its catalog emptied for the test."""
    from idem_assets.lib.backends.spark import locks
    from idem_assets.lib.backends.spark.backend import SparkBackend
    from idem_assets.lib.backends.spark.layout import OWNER
    from tests.spark_session import drop_schema

    spark = request.getfixturevalue("spark")
    spark_conf = request.getfixturevalue("spark_conf")
    # One session (and metastore) per worker: each test starts from an empty catalog (the
    # library's own table locks, released after every commit, stay).
    own = ("default", locks.DATABASE)
    for db in spark.catalog.listDatabases():
        if db.name not in own:
            drop_schema(spark, db.name)
    warehouse = str(directory / "warehouse")
    backend = SparkBackend(spark, warehouse)

    def rows(table: str) -> list[tuple]:
        found = backend.table("main", table)
        names = ", ".join(f"`{c}`" for c in found.columns)
        return sorted(tuple(r) for r in spark.sql(f"SELECT {names} FROM main.`{table}`").collect())

    def snapshot() -> dict[str, str | None]:
        found: dict[str, str | None] = {}
        for db in spark.catalog.listDatabases():
            if db.name == locks.DATABASE:
                continue
            for t in spark.catalog.listTables(db.name):
                if t.isTemporary:
                    continue
                owner = backend.table(db.name, t.name).properties.get(OWNER)
                fingerprint = ia.table_fingerprint(backend, db.name, t.name)
                found[f"{db.name}.{t.name}"] = f"{fingerprint} {owner}"
        return found

    return Store(
        name="spark",
        open=partial(spark_backend, spark_conf, warehouse),
        config={"spark_conf": spark_conf, "warehouse": warehouse},
        rows=rows,
        snapshot=snapshot,
    )


def iceberg_store(request: pytest.FixtureRequest, directory: Path) -> Store:
    """The Iceberg backend on a SQLite catalog file and a warehouse folder."""
    return _iceberg(IcebergLocation.local(directory / "iceberg"), "iceberg")


def iceberg_postgres_store(request: pytest.FixtureRequest, directory: Path) -> Store:
    """The Iceberg backend on a SQL catalog in a fresh PostgreSQL database."""
    location: PostgresLocation = request.getfixturevalue("postgres_location")
    request.getfixturevalue("monkeypatch").setenv(PASSWORD_ENV, str(location.password))
    uri = (
        f"postgresql+psycopg2://{location.user}@{location.host}:{location.port}/{location.database}"
    )
    warehouse = f"file://{directory / 'warehouse'}"
    where = IcebergLocation(uri, warehouse, password_env=PASSWORD_ENV)
    return _iceberg(where, "iceberg-postgres", {PASSWORD_ENV: str(location.password)})


@contextmanager
def iceberg_backend(
    location: IcebergLocation, environment: Mapping[str, str] | None = None
) -> Iterator[Backend]:
    """The Iceberg backend on ``location``, closed after; ``environment`` is set first.

    A racing child process comes from a fork server started before the test set the catalog's
    password in the environment: it gets the variable this way.
    """
    os.environ.update(environment or {})
    with IcebergBackend(location) as backend:
        yield backend


def _iceberg(
    location: IcebergLocation, name: str, environment: Mapping[str, str] | None = None
) -> Store:
    config = {
        "catalog_uri": location.uri,
        "warehouse": location.warehouse,
        "password_env": location.password_env,
    }

    def rows(table: str) -> list[tuple]:
        with IcebergBackend(location) as backend:
            stored = backend.catalog.load_table(("main", table)).scan().to_arrow()
        return sorted(zip(*stored.to_pydict().values(), strict=True))

    def snapshot() -> dict[str, str | None]:
        # The owner is a table property: it is part of each table's record.
        found: dict[str, str | None] = {}
        with IcebergBackend(location) as backend:
            catalog = backend.catalog
            for namespace in catalog.list_namespaces():
                for schema, table in catalog.list_tables(namespace):
                    owner = catalog.load_table((schema, table)).properties.get(OWNER_PROPERTY)
                    fingerprint = ia.table_fingerprint(backend, schema, table)
                    found[f"{schema}.{table}"] = f"{fingerprint} {owner}"
        return found

    return Store(
        name=name,
        open=partial(iceberg_backend, location, dict(environment or {})),
        config=config,
        rows=rows,
        snapshot=snapshot,
        env=dict(environment or {}),
    )


FACTORIES: dict[str, Callable[[pytest.FixtureRequest, Path], Store]] = {
    "delta": delta_store,
    "duckdb": duckdb_store,
    "iceberg": iceberg_store,
    "iceberg-postgres": iceberg_postgres_store,
    "postgres": postgres_store,
    "spark": spark_store,
}

#: ``IDEM_FULL=1`` (``make test-full``) runs the whole suite on every store. The everyday run
#: gives two stores a share: the Iceberg PostgreSQL catalog its races and first writers, where
#: the catalogs' compare-and-swap differs (the rest runs on the Iceberg SQLite catalog, the same
#: backend); Spark, whose every publish is several Spark jobs and metastore calls on two shared
#: cores, the replace contract and one round of the race of two days' merges of tables (each
#: racing writer starts a JVM of its own: the streamed and upsert forms of that race took 110 s
#: and 160 s more of a loaded run, and a Spark merge of a batch from Arrow or from a stream
#: counts the keys stored elsewhere through the same join, right before its commit, in every
#: form).
#: Spark's first writers of one day race in tests/spark/test_processes.py (two drivers, a new
#: table, one batch left), so make test does not run that race twice.
FULL = os.environ.get("IDEM_FULL", "") not in ("", "0")
RACE_OF_TABLES = (
    "test_races.py::test_merges_of_two_days_sharing_a_new_key_leave_it_in_exactly_one_day"
    "[spark-table]"
)
EVERYDAY: dict[str, tuple[str, ...]] = {
    "iceberg-postgres": ("test_races.py", "test_first_writers.py"),
    "spark": ("test_replace_contract.py", RACE_OF_TABLES),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave the stores of EVERYDAY only their share unless IDEM_FULL is set."""
    if FULL:
        return
    kept, dropped = [], []
    for item in items:
        share = next(
            (v for k, v in EVERYDAY.items() if f"[{k}-" in item.nodeid or f"[{k}]" in item.nodeid),
            None,
        )
        everyday = share is None or any(name in item.nodeid for name in share)
        (kept if everyday else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(params=sorted(FACTORIES))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """A fresh store of each backend in turn."""
    return FACTORIES[request.param](request, tmp_path)
