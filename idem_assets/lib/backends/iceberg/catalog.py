"""Where Iceberg tables live: a catalog (SQLite file, PostgreSQL, or REST) and a warehouse.

A SQL catalog keeps one row per table, the location of its current metadata file, and commits by
compare-and-swap on that row; the SQLite file needs nothing started, the PostgreSQL one can be the
database that holds the Dagster instance. A REST catalog is reached by URL (Polaris, Lakekeeper,
Nessie, AWS Glue's or S3 Tables' REST endpoint). The warehouse is a folder or object storage
(``s3://bucket/prefix`` with ``s3.*`` properties, read and written by pyarrow's filesystem).
"""

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote as url_quote
from urllib.parse import urlsplit, urlunsplit

from pyiceberg.catalog import Catalog

from idem_assets.lib.model.errors import ConfigurationError

#: The name a catalog's tables are registered under in a SQL catalog's ``iceberg_tables``.
DEFAULT_CATALOG_NAME = "idem"
_SQL_SCHEMES = ("sqlite", "postgresql", "postgresql+psycopg2")


@dataclass(frozen=True)
class IcebergLocation:
    """A catalog and a warehouse; the password (PostgreSQL) is read when the catalog opens."""

    #: ``sqlite:////abs/path/catalog.db``, ``postgresql+psycopg2://user@host:5432/db`` (no
    #: password), or ``http(s)://host/...`` for a REST catalog.
    uri: str
    #: ``file:///abs/folder`` or ``s3://bucket/prefix``; a REST catalog may choose its own.
    warehouse: str | None = None
    #: pyiceberg catalog properties (``s3.endpoint``, ``s3.region``, a REST ``token``, ...).
    properties: dict[str, str] = field(default_factory=dict)
    #: The environment variable holding the PostgreSQL password; ``None``: none needed.
    password_env: str | None = None
    name: str = DEFAULT_CATALOG_NAME

    @classmethod
    def local(cls, root: str | Path, name: str = DEFAULT_CATALOG_NAME) -> "IcebergLocation":
        """A SQLite catalog file and a warehouse folder under ``root`` (created on first use)."""
        path = Path(root).resolve()
        return cls(
            uri=f"sqlite:///{path / 'catalog.db'}",
            warehouse=f"file://{path / 'warehouse'}",
            name=name,
        )

    @property
    def scheme(self) -> str:
        """The catalog's URL scheme: ``sqlite``, ``postgresql+psycopg2``, ``http``, ``https``."""
        return urlsplit(self.uri).scheme

    @property
    def is_rest(self) -> bool:
        """Whether the catalog is a REST server."""
        return self.scheme in ("http", "https")

    def describe(self) -> str:
        """The catalog and warehouse for messages: never a password."""
        parts = urlsplit(self.uri)
        host = parts.hostname or ""
        if parts.username:
            host = f"{parts.username}@{host}"
        if parts.port:
            host = f"{host}:{parts.port}"
        shown = urlunsplit((parts.scheme, host, parts.path, "", ""))
        return f"Iceberg catalog {shown}" + (
            f", warehouse {self.warehouse}" if self.warehouse else ""
        )

    def catalog_uri(self) -> str:
        """The catalog URL with the password from the environment (PostgreSQL)."""
        parts = urlsplit(self.uri)
        if not parts.scheme.startswith("postgresql"):
            return self.uri
        if parts.password:
            raise ConfigurationError(
                f"The Iceberg catalog URL {self.describe()!r} holds a password. Nothing was"
                " changed. Fix: leave it out of the URL and name the environment variable that"
                " holds it: password_env='PGPASSWORD'."
            )
        if parts.scheme == "postgresql":
            # SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3, which is not installed.
            parts = parts._replace(scheme="postgresql+psycopg2")
        if self.password_env is None:
            return urlunsplit(parts)
        password = os.environ.get(self.password_env)
        if password is None:
            raise ConfigurationError(
                f"The Iceberg catalog on PostgreSQL reads its password from the environment"
                f" variable {self.password_env!r}, which is not set. Nothing was changed. Fix:"
                f" export {self.password_env}=... where the runs execute, or set password_env to"
                " the variable that holds it (None for a login without a password)."
            )
        user = url_quote(parts.username or "", safe="")
        netloc = f"{user}:{url_quote(password, safe='')}@{parts.hostname}"
        if parts.port:
            netloc += f":{parts.port}"
        return urlunsplit(parts._replace(netloc=netloc))

    def open(self) -> Catalog:
        """The pyiceberg catalog (a ``SqlCatalog`` or a ``RestCatalog``)."""
        properties = dict(self.properties)
        if self.warehouse:
            properties["warehouse"] = self.warehouse
            if self.warehouse.startswith("file://"):
                Path(self.warehouse.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
        if self.is_rest:
            from pyiceberg.catalog.rest import RestCatalog

            return RestCatalog(self.name, uri=self.uri, **properties)
        if self.scheme not in _SQL_SCHEMES:
            raise ConfigurationError(
                f"The Iceberg catalog URL {self.describe()!r} names no catalog idem_assets can"
                " open. Nothing was changed. Fix: use sqlite:////path/catalog.db,"
                " postgresql+psycopg2://user@host:5432/database, or the http(s) URL of a REST"
                " catalog."
            )
        if self.scheme == "sqlite":
            Path(urlsplit(self.uri).path).parent.mkdir(parents=True, exist_ok=True)
        from pyiceberg.catalog.sql import SqlCatalog
        from sqlalchemy.exc import DatabaseError

        try:
            return SqlCatalog(self.name, uri=self.catalog_uri(), **properties)
        except DatabaseError:
            # Two first writers of a new catalog both found its tables absent and both created
            # them; the one that lost finds them now. Any other error comes back the same.
            return SqlCatalog(self.name, uri=self.catalog_uri(), **properties)

    def code(self) -> str:
        """A Python expression that opens this catalog (the password read from the environment).

        It needs ``import os, urllib.parse, pyiceberg.catalog.sql, pyiceberg.catalog.rest``.
        """
        args = [repr(self.name), f"uri={self.uri!r}"]
        if self.warehouse:
            args.append(f"warehouse={self.warehouse!r}")
        args += [f"**{{{k!r}: {v!r}}}" for k, v in sorted(self.properties.items())]
        if self.is_rest:
            return f"pyiceberg.catalog.rest.RestCatalog({', '.join(args)})"
        if self.password_env is not None and self.scheme.startswith("postgresql"):
            parts = urlsplit(self.uri)
            head = f"{parts.scheme}://{parts.username}:"
            tail = f"@{parts.hostname}" + (f":{parts.port}" if parts.port else "") + parts.path
            password = f"urllib.parse.quote(os.environ[{self.password_env!r}], safe='')"
            args[1] = f"uri={head!r} + {password} + {tail!r}"
        return f"pyiceberg.catalog.sql.SqlCatalog({', '.join(args)})"


def release(catalog: Catalog) -> None:
    """Close a SQL catalog's connection pool (a REST catalog holds none worth closing)."""
    engine = getattr(catalog, "engine", None)
    if engine is not None:
        engine.dispose()
