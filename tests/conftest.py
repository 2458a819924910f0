"""Fixtures every test directory may use: a real PostgreSQL server for the session."""

import os
import uuid
from collections.abc import Iterator

import pytest
from postgres_server import PostgresServer, PostgresUnavailableError, find_bin_dir

from idem_assets.lib.backends.postgres import PostgresLocation


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
