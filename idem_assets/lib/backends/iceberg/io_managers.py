"""The idempotent IO managers on Apache Iceberg: the Dagster plumbing over the Iceberg backend."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar, Self

from pydantic import Field

from idem_assets.lib.backends.iceberg.backend import IcebergBackend
from idem_assets.lib.backends.iceberg.catalog import DEFAULT_CATALOG_NAME, IcebergLocation
from idem_assets.lib.dagster_layer.io_manager import IdempotentIOManager
from idem_assets.lib.model.settings import WriteMode, WriteSettings


class _IcebergIOManager(IdempotentIOManager):
    """Opens the Iceberg backend on a catalog; a PostgreSQL password comes from the environment."""

    catalog_uri: str = Field(
        description=(
            "The catalog: sqlite:////abs/path/catalog.db (a file, created on first write),"
            " postgresql+psycopg2://user@host:5432/database (no password: see password_env), or"
            " the http(s) URL of a REST catalog."
        ),
    )
    warehouse: str | None = Field(
        default=None,
        description=(
            "Where the table files live: file:///abs/folder or s3://bucket/prefix. A REST"
            " catalog may choose its own (leave it unset)."
        ),
    )
    properties: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "pyiceberg catalog properties, e.g. s3.endpoint, s3.region, s3.access-key-id for"
            " object storage, or a REST catalog's token."
        ),
    )
    password_env: str | None = Field(
        default=None,
        description=(
            "Name of the environment variable holding the PostgreSQL catalog's password, read"
            " when the catalog opens; it never appears in config, logs, metadata or messages."
        ),
    )
    catalog_name: str = Field(
        default=DEFAULT_CATALOG_NAME,
        description="The catalog's name (a SQL catalog keeps its tables under it).",
    )

    def location(self) -> IcebergLocation:
        """The catalog and warehouse this IO manager writes."""
        return IcebergLocation(
            uri=self.catalog_uri,
            warehouse=self.warehouse,
            properties=dict(self.properties),
            password_env=self.password_env,
            name=self.catalog_name,
        )

    @contextmanager
    def _backend(self) -> Iterator[IcebergBackend]:
        with IcebergBackend(self.location()) as backend:
            yield backend

    storage_kind: ClassVar[str] = "iceberg"

    def _table_name(self, settings: WriteSettings) -> str:
        """``<catalog>.<namespace>.<table>``."""
        return f"{self.catalog_name}.{settings.schema}.{settings.table}"

    def _location(self) -> str:
        return self.location().describe()

    def relocated(self, directory: Path) -> Self | None:
        """A SQLite catalog and a warehouse folder in ``directory``; a server's catalog stays."""
        local = self.warehouse is None or self.warehouse.startswith("file://")
        if not self.catalog_uri.startswith("sqlite:") or not local:
            return None
        moved = IcebergLocation.local(directory / "iceberg", self.catalog_name)
        return self._replaced(catalog_uri=moved.uri, warehouse=moved.warehouse)


class IcebergOverwriteIOManager(_IcebergIOManager):
    """Replaces the run's partition window with the batch in one Iceberg snapshot."""

    mode: ClassVar[WriteMode] = "overwrite"


class IcebergMergeIOManager(_IcebergIOManager):
    """Upserts the batch on 'primary_key' (stale rows of the window deleted) in one snapshot."""

    mode: ClassVar[WriteMode] = "merge"
