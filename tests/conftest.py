"""Fixtures every test directory may use (a real PostgreSQL server), and how tests share workers."""

import os
import uuid
from collections.abc import Iterator

import pytest
from postgres_server import PostgresServer, PostgresUnavailableError, find_bin_dir

from idem_assets.lib.backends.postgres import PostgresLocation

#: Tests that start dagster-daemon, the webserver or Chromium run one after another on one
#: worker (`make test` runs two, pytest-xdist's loadgroup): two daemons' start-ups and ticks at
#: once would only slow both, while in-process tests fill the other core.
SERVICE_DIRS = ("e2e", "browser")


def pytest_configure(config: pytest.Config) -> None:
    """Keep the suite off the instance `make` exports (DAGSTER_HOME=.dagster_home).

    Loading the code location stores the warehouse pool in $DAGSTER_HOME's instance
    (idem_assets/defs/pools.py): every worker would write the developer's SQLite instance at
    once. Tests that want an instance make their own under tmp_path.
    """
    os.environ.pop("DAGSTER_HOME", None)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put every test of a service-starting directory in one xdist group."""
    for item in items:
        if item.path.parent.name in SERVICE_DIRS:
            item.add_marker(pytest.mark.xdist_group("services"))


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL on 127.0.0.1; skipped when not installed locally, an error in CI."""
    try:
        bin_dir = find_bin_dir()
    except PostgresUnavailableError as error:
        if os.environ.get("CI"):
            pytest.fail(f"{error}; CI must run the PostgreSQL tests.")
        pytest.skip(str(error))
    server = PostgresServer.start(bin_dir)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_location(postgres_server: PostgresServer) -> PostgresLocation:
    """A fresh, empty database on the session's server, as the Postgres backend reaches it."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    postgres_server.create_database(name)
    server = postgres_server
    return PostgresLocation(server.host, server.port, server.user, name, server.password)
