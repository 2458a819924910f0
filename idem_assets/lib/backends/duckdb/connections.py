"""Connections to a DuckDB file that wait for its writer lock and always close."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
from dagster_duckdb import DuckDBResource


@contextmanager
def duckdb_connection(
    database: str, connection_config: dict[str, Any] | None = None
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A DuckDB connection that waits for the writer lock and is closed on every path."""
    # DuckDBResource retries while another process holds the file's writer lock; its own
    # context manager skips close() when the body raises, so close here on every path.
    if database != ":memory:" and not database.startswith("md:"):
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    resource = DuckDBResource(database=database, connection_config=connection_config or {})
    with resource.get_connection() as conn:
        try:
            yield conn
        finally:
            conn.close()
