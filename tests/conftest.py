"""Fixtures every test directory may use: a real PostgreSQL server for the session."""

import os
from collections.abc import Iterator

import pytest
from postgres_server import PostgresServer, PostgresUnavailableError, find_bin_dir


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
