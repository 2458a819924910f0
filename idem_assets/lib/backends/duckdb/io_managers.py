"""The idempotent IO managers on DuckDB: the Dagster plumbing over the DuckDB backend."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import Field

from idem_assets.lib.backends.duckdb.backend import DuckDBBackend
from idem_assets.lib.backends.duckdb.connections import duckdb_connection
from idem_assets.lib.dagster_layer.io_manager import IdempotentIOManager
from idem_assets.lib.model.settings import WriteMode, WriteSettings
from idem_assets.lib.write.seam import Capabilities


class _DuckDBIOManager(IdempotentIOManager):
    """Opens the DuckDB backend on a database file."""

    database: str = Field(
        description="Path of the DuckDB database file (created on first write).",
    )
    connection_config: dict[str, Any] = Field(
        default_factory=dict,
        description="DuckDB configuration options passed to duckdb.connect (e.g. memory_limit).",
    )

    @contextmanager
    def _backend(self) -> Iterator[DuckDBBackend]:
        with duckdb_connection(self.database, self.connection_config) as conn:
            yield DuckDBBackend(conn)

    storage_kind: ClassVar[str] = "duckdb"
    capabilities: ClassVar[Capabilities | None] = DuckDBBackend.capabilities

    def _location(self) -> str:
        return self.database

    def _table_name(self, settings: WriteSettings) -> str:
        """``<database file>.<schema>.<table>``, as dagster-duckdb names it."""
        return f"{self.database}.{settings.schema}.{settings.table}"

    def relocated(self, directory: Path) -> Self:
        """The same file name, in ``directory``."""
        return self._replaced(database=str(directory / Path(self.database).name))


class DuckDBOverwriteIOManager(_DuckDBIOManager):
    """Replaces the run's partition window with the batch in one DuckDB transaction."""

    mode: ClassVar[WriteMode] = "overwrite"


class DuckDBMergeIOManager(_DuckDBIOManager):
    """Upserts the batch on 'primary_key' and deletes the window's stale rows in one transaction."""

    mode: ClassVar[WriteMode] = "merge"
