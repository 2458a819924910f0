"""The idempotent IO managers on PostgreSQL: the same Dagster plumbing over the Postgres backend."""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

from pydantic import Field

from idem_assets.lib.backends.postgres.backend import PostgresBackend, PostgresLocation
from idem_assets.lib.dagster_layer.io_manager import IdempotentIOManager
from idem_assets.lib.model.errors import ConfigurationError
from idem_assets.lib.model.settings import WriteMode, WriteSettings
from idem_assets.lib.write.seam import Capabilities


class _PostgresIOManager(IdempotentIOManager):
    """Opens the Postgres backend on a server; the password comes from the environment."""

    url: str | None = Field(
        default=None,
        description=(
            "The server and database as a URL, postgresql://user@host:5432/database (query"
            " parameters such as ?sslmode=require are passed to libpq). Leave the password out:"
            " it is read from password_env. When set, host, port, user and database are ignored."
        ),
    )
    host: str = Field(default="localhost", description="The server's host name or address.")
    port: int = Field(default=5432, description="The server's port.")
    user: str = Field(default="postgres", description="The login role.")
    database: str = Field(default="postgres", description="The database holding the tables.")
    password_env: str | None = Field(
        default="PGPASSWORD",
        description=(
            "Name of the environment variable holding the password (libpq's PGPASSWORD unless"
            " told). The password is read when a connection opens and never appears in config,"
            " logs, metadata or error messages. None: connect without a password."
        ),
    )

    def location(self) -> PostgresLocation:
        """Where the tables live, with the password read from the environment now."""
        password = None
        if self.password_env is not None:
            password = os.environ.get(self.password_env)
            if password is None and self.url is None:
                raise ConfigurationError(
                    f"The PostgreSQL IO manager reads its password from the environment variable"
                    f" {self.password_env!r}, which is not set. Nothing was changed. Fix: export"
                    f" {self.password_env}=... where the runs execute, or set password_env to the"
                    " variable that holds it (None for a login without a password)."
                )
        if self.url is not None:
            return PostgresLocation.from_url(self.url, password)
        return PostgresLocation(self.host, self.port, self.user, self.database, password)

    @contextmanager
    def _backend(self) -> Iterator[PostgresBackend]:
        with PostgresBackend.connect(self.location()) as backend:
            yield backend

    storage_kind: ClassVar[str] = "postgres"
    capabilities: ClassVar[Capabilities | None] = PostgresBackend.capabilities

    def _location(self) -> str:
        return self.location().describe()

    def _table_name(self, settings: WriteSettings) -> str:
        """``<database>.<schema>.<table>`` (the location read without its password)."""
        database = PostgresLocation.from_url(self.url, None).database if self.url else self.database
        return f"{database}.{settings.schema}.{settings.table}"


class PostgresOverwriteIOManager(_PostgresIOManager):
    """Replaces the run's partition window with the batch in one PostgreSQL transaction."""

    mode: ClassVar[WriteMode] = "overwrite"


class PostgresMergeIOManager(_PostgresIOManager):
    """Upserts the batch on 'primary_key' and deletes the window's stale rows in one transaction."""

    mode: ClassVar[WriteMode] = "merge"
