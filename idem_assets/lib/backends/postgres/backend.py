"""The PostgreSQL backend: one transaction per publish, binary COPY of Arrow, per-partition locks.

The refusals are the guards' (:mod:`idem_assets.lib.write.guards`), decided on the staged Arrow batch
in an embedded DuckDB: nothing goes to the server before they pass, except the batch's keys for
a merge (a temporary table the transaction drops). Writers of one window queue on
transaction-scoped advisory locks, one per partition, taken in sorted order, so two writers of a
partition can never double it while writers of other partitions run in parallel; readers are
never blocked.
Rows travel as Arrow over the ADBC driver's binary COPY.
"""

import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

import adbc_driver_postgresql.dbapi as adbc
import duckdb
import pandas as pd
import pyarrow as pa

from idem_assets.lib.backends.duckdb import sql as duck_sql
from idem_assets.lib.backends.postgres import sql
from idem_assets.lib.backends.postgres.types import (
    PostgresTypes,
    arrow_type,
    text_lengths,
    timestamp_digits,
)
from idem_assets.lib.model.errors import ConfigurationError, SchemaMismatchError
from idem_assets.lib.model.identifiers import qualified, quote, validate_identifier
from idem_assets.lib.model.samples import format_sample
from idem_assets.lib.model.settings import WriteSettings, spelt_partitions
from idem_assets.lib.model.windows import Region, WriteWindow, region_of
from idem_assets.lib.sql import statements as batch_sql
from idem_assets.lib.write import guards
from idem_assets.lib.write.schema_fit import (
    ColumnFit,
    SchemaChange,
    StoredDigits,
    change_sql,
    evolved,
    fit_columns,
    refuse_cut_names,
    refuse_lossy_values,
    refuse_unreadable_columns,
    refuse_unstorable_text,
    rounded_timestamps,
    schema_changes,
    stored_batch,
)
from idem_assets.lib.write.seam import (
    CommitConflict,
    Counts,
    PartitionColumns,
    Rounding,
    Scope,
    Staged,
    Target,
)

#: The library's own names are not plain identifiers, so no asset, schema or column can be
#: given one (validate_identifier refuses them) and shadow or be shadowed by them.
BATCH_PREFIX = "idem-batch-"
KEYS_PREFIX = "idem-keys-"
#: Each schema records which asset writes which of its tables in a table of its own, so a role
#: that owns only its schema keeps the record where it can write.
OWNERS_TABLE = "idem-table-owners"
#: Where the records were kept before: one found there is still honoured.
LEGACY_OWNERS_SCHEMA = "public"
#: Pinned per session, so a value read as text (a sample in a message) reads the same for everyone.
SESSION_OPTIONS = "-c TimeZone=UTC -c DateStyle=ISO,MDY -c extra_float_digits=1"
DIALECT = PostgresTypes()
T = TypeVar("T", pa.Table, pa.RecordBatch)


@dataclass(frozen=True)
class PostgresLocation:
    """Where the warehouse is: a server, a database and a login (the password is never shown)."""

    host: str
    port: int
    user: str
    database: str
    password: str | None = field(default=None, repr=False)
    #: Further libpq parameters, e.g. ``{"sslmode": "require"}`` (``sslpassword`` is one).
    options: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_url(cls, url: str, password: str | None = None) -> "PostgresLocation":
        """Parse ``postgresql://user@host:port/database?sslmode=...``; ``password`` wins.

        The host may be a Unix socket's directory, its slashes written ``%2F``. No message
        shows the URL's password, nor any part of a login the URL does not delimit.
        """
        _refuse_unescaped_login(url)
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = -1
        if (
            parts.scheme.split("+")[0] not in ("postgresql", "postgres")
            or not parts.path[1:]
            or port == -1
        ):
            raise ConfigurationError(
                f"The PostgreSQL URL {_shown(parts)!r} is not of the form"
                " postgresql://user@host:5432/database. Nothing was changed. Fix: set url to"
                " such a URL, or set host, port, user and database instead."
            )
        options = dict(parse_qsl(parts.query))
        # libpq takes the password as a query parameter too; it must never be shown as one.
        in_query = options.pop("password", None)
        if password is None:
            password = _unquoted(parts.password) if parts.password is not None else in_query
        return cls(
            host=unquote(_host(parts.netloc)) or "localhost",
            port=port or 5432,
            user=unquote(parts.username or ""),
            database=unquote(parts.path[1:]),
            password=password,
            options=options,
        )

    def describe(self) -> str:
        """The location for messages: ``postgresql://user@host:port/database``."""
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.database}"

    def conninfo(self) -> str:
        """The keyword/value connection string libpq reads, every value quoted."""
        values = {
            "host": self.host,
            "port": str(self.port),
            "user": self.user,
            "dbname": self.database,
            **self.options,
            # The user's own options first: a later -c of the same setting wins, and the
            # pinned ones must.
            "options": " ".join(filter(None, [self.options.get("options"), SESSION_OPTIONS])),
        }
        if self.password is not None:
            values["password"] = self.password
        return " ".join(f"{k}={_libpq_quote(v)}" for k, v in values.items())


def _unquoted(value: str | None) -> str | None:
    return unquote(value) if value is not None else None


def _redacted(text: str, password: str | None) -> str:
    return text.replace(password, "***") if password else text


def _refuse_unescaped_login(url: str) -> None:
    """Refuse a URL with an ``@`` after its host: a login holding ``/``, ``?`` or ``#``.

    Unescaped, any of them ends the login early, so the rest of the password would be read as
    the host, the path or the query, and shown as such; the message shows none of the URL.
    """
    rest = url.partition("://")[2]
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    if "@" in rest[end:]:
        raise ConfigurationError(
            "The PostgreSQL URL has an '@' after its host part, so its login cannot be told"
            " from its host: a password holding '/', '?' or '#' ends the login there unless"
            " percent-encoded (the URL is not shown, as it may hold the password). Nothing was"
            " changed. Fix: leave the password out of the URL (postgresql://user@host:5432/"
            "database) and export it in the variable password_env names; or percent-encode"
            " it in the URL, urllib.parse.quote(password, safe=''); write any other '@' as %40."
        )


def _host(netloc: str) -> str:
    """The host of a URL's authority, as written (a socket directory keeps its case)."""
    host = netloc.rpartition("@")[2]
    if host.startswith("["):
        return host[1 : host.find("]")]
    return host.partition(":")[0]


def _shown(parts: SplitResult) -> str:
    """The URL for a message: its password and any password parameter replaced by ``***``."""
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username}:***@{netloc.rpartition('@')[2]}"
    query = "&".join(f"{k}={'***' if 'password' in k else v}" for k, v in parse_qsl(parts.query))
    return parts._replace(netloc=netloc, query=query, fragment="").geturl()


def _libpq_quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def owners_of(schema: str) -> str:
    """The owners table of ``schema``, as SQL spells it."""
    return f"{quote(validate_identifier(schema, 'schema'))}.{quote(OWNERS_TABLE)}"


class PostgresConnectionError(ConnectionError):
    """The server refused or could not be reached; the message never holds the password."""


@contextmanager
def postgres_connection(location: PostgresLocation) -> Iterator[adbc.Connection]:
    """An ADBC connection to ``location`` (autocommit off) that is closed on every path."""
    try:
        conn = adbc.connect(location.conninfo())
    except adbc.Error as exc:
        # libpq names the server and the login, never the password; redact it all the same.
        message = _redacted(str(exc), location.password)
        raise PostgresConnectionError(
            f"Could not connect to {location.describe()}: {message.strip()} Fix: start the"
            " server or correct host, port, user and database; the password comes from the"
            " environment variable the IO manager's password_env names."
        ) from None
    try:
        yield conn
    finally:
        conn.close()


class PostgresBackend:
    """Publishes through one open ADBC connection; the caller owns (and closes) it."""

    engine = "Postgres"

    def __init__(self, conn: adbc.Connection) -> None:
        """Wrap ``conn``; nothing is read until a publish asks."""
        self.conn = conn
        self.cur = conn.cursor()
        self._duck: duckdb.DuckDBPyConnection | None = None
        self._reset()

    def _reset(self) -> None:
        self._where = ""
        self._table_cols: dict[str, str] | None = None
        self._fits: list[ColumnFit] = []
        self._stored: pa.Table | None = None
        #: The rows the write copied in (the batch, deduplicated for a merge).
        self._written: pa.Table | None = None
        self._registered: list[str] = []
        self._temp: list[str] = []
        self._keys = ""
        self._key_ranges: list[tuple[Any, Any]] = []
        self._locked = False
        #: The table's columns as described, before any lock: a concurrent writer may change
        #: them until this publish holds the table.
        self._described: dict[str, str] | None = None
        self._owners_exist = False
        self._owners_at = ""

    def close(self) -> None:
        """Close the cursor and the embedded evaluator (not the connection)."""
        self.cur.close()
        if self._duck is not None:
            self._duck.close()

    @classmethod
    @contextmanager
    def connect(cls, location: PostgresLocation) -> Iterator["PostgresBackend"]:
        """A backend on a new connection to ``location``; both are closed after."""
        with postgres_connection(location) as conn:
            backend = cls(conn)
            try:
                yield backend
            finally:
                backend.close()

    def _run(self, statement: str | sql.Statement) -> None:
        query, params = (statement, []) if isinstance(statement, str) else statement
        self.cur.execute(query, params or None)

    def _rows(self, statement: str | sql.Statement) -> list[tuple[Any, ...]]:
        self._run(statement)
        return self.cur.fetchall()

    @contextmanager
    def transaction(self, where: str) -> Iterator[None]:
        """One transaction: COMMIT when the body returns, ROLLBACK when it raises."""
        # Ends whatever a read before this left open, so the publish starts a transaction anew.
        self.conn.rollback()
        self._reset()
        self._where = where
        try:
            yield
            for name in self._temp:
                # Dropped inside the transaction, so a commit leaves nothing behind.
                self._run(f"DROP TABLE IF EXISTS {name}")
            self.conn.commit()
        except BaseException as exc:
            try:
                self.conn.rollback()
            except adbc.Error:
                # A broken connection has ended the transaction: report what got us here.
                pass
            if isinstance(exc, adbc.Error):
                exc.add_note(_database_failed(where))
            raise
        finally:
            if self._duck is not None:
                for name in self._registered:
                    self._duck.unregister(name)
            self._registered = []

    def evaluator(self) -> duckdb.DuckDBPyConnection:
        """An embedded DuckDB holding the staged batch: the guards never query the server."""
        if self._duck is None:
            self._duck = duckdb.connect()
        return self._duck

    def describe(self, settings: WriteSettings) -> Target:
        """One catalog query for the table's columns and the owners tables."""
        s = settings
        rows = self._rows(sql.describe(OWNERS_TABLE, LEGACY_OWNERS_SCHEMA, s.schema, s.table))
        kinds = {kind for kind, _, _ in rows}
        self._table_cols = {name: t for kind, name, t in rows if kind == 0} or None
        self._described = dict(self._table_cols) if self._table_cols else None
        self._owners_exist = 1 in kinds
        self._owners_at = owners_of(s.schema)
        owner = self._owner(settings, self._owners_at) if 1 in kinds else None
        if owner is None and 2 in kinds:
            owner = self._owner(settings, owners_of(LEGACY_OWNERS_SCHEMA))
            if owner is not None:
                self._owners_at = owners_of(LEGACY_OWNERS_SCHEMA)
        return Target(exists=self._table_cols is not None, owner=owner)

    def _owner(self, settings: WriteSettings, owners: str) -> str | None:
        found = self._rows(
            (
                f"SELECT asset_key FROM {owners} WHERE schema_key = $1 AND table_key = $2",
                [settings.schema.lower(), settings.table.lower()],
            )
        )
        return found[0][0] if found else None

    def stage(self, batch: pa.Table, settings: WriteSettings, where: str) -> Staged:
        """Cast the batch to the stored names and types in Arrow, and hand it to the guards."""
        refuse_cut_names(settings, where, batch.column_names, DIALECT.name_bytes, DIALECT.engine)
        cols = self._table_cols or {}
        unreadable = {c: kind for c, kind in cols.items() if arrow_type(kind) is None}
        digits = {c: self._digits(settings, c) for c, k in unreadable.items() if k == "numeric"}
        refuse_unreadable_columns(settings, where, batch.schema, unreadable, digits, DIALECT)
        table = _arrow_types(self._table_cols, _name(settings)) if self._table_cols else None
        changes = schema_changes(settings, where, batch.schema, table, DIALECT)
        if table is not None and changes:
            table = evolved(table, changes)
        fits = fit_columns(settings, where, batch.schema, table, DIALECT)
        refuse_lossy_values(batch, fits, settings, where, DIALECT)
        lengths = text_lengths(self._table_cols or {})
        refuse_unstorable_text(batch, fits, settings, where, DIALECT, lengths, holds_nul=False)
        stored = stored_batch(batch, fits)
        rounds = _roundings(fits, self._table_cols or {})
        for r in rounds:
            # The server would round these; rounded here, the guards judge what it stores.
            at = stored.schema.get_field_index(r.stored_name)
            rounded = rounded_timestamps(stored.column(at), r.digits)
            stored = stored.set_column(at, r.stored_name, rounded)
        if self._table_cols:
            # COPY fills columns in the table's order; an added column comes last, as ADD COLUMN
            # puts it.
            added = [c.column for c in changes if c.action == "add_column"]
            stored = stored.select([*self._table_cols, *added])
        self._fits, self._stored = fits, stored
        relation = self._register(stored)
        sent = self._register(batch) if rounds else ""
        by_name = {f.name.lower(): f for f in fits}

        def spelt(names: Sequence[str]) -> tuple[str, ...]:
            return tuple(by_name[n.lower()].stored_name for n in names)

        spelt_settings = replace(
            spelt_partitions(settings, {n: f.stored_name for n, f in by_name.items()}),
            primary_key=spelt(settings.primary_key),
            dedupe_order_by=spelt(settings.dedupe_order_by),
        )
        return Staged(
            relation=relation,
            settings=spelt_settings,
            partition_types={
                c: by_name[c.lower()].stored_type for c in spelt_settings.partition_names
            },
            changes=tuple(changes),
            rounds=rounds,
            sent=sent,
        )

    def _digits(self, settings: WriteSettings, column: str) -> StoredDigits:
        """The digits the values of a ``numeric`` column without precision need."""
        found = self._rows(sql.numeric_digits(_name_sql(settings), column))[0]
        return StoredDigits(found[0] or 0, found[1] or 0, found[2] is not False)

    def evolve(self, settings: WriteSettings, changes: Sequence[SchemaChange]) -> None:
        """Run each change's ALTER TABLE: PostgreSQL's DDL is part of the open transaction."""
        target = qualified(settings.schema, settings.table)
        for change in changes:
            self._run(change_sql(target, change, DIALECT))
        if self._table_cols is not None:
            self._table_cols |= {c.column: DIALECT.type_sql(c.type) for c in changes}

    def column_types(self, settings: WriteSettings) -> dict[str, pa.DataType] | None:
        """The table's columns as Arrow types, or ``None`` when there is no table."""
        cols = self._columns(settings.schema, settings.table)
        return _arrow_types(cols, _name(settings)) if cols is not None else None

    def _columns(self, schema: str, table: str) -> dict[str, str] | None:
        rows = self._rows(sql.table_columns(schema, table))
        return dict(rows) if rows else None

    def _lock(self, scope: Scope) -> None:
        """Wait for every other writer of this window: one lock per partition, sorted.

        A writer that changes the table's schema then waits for every other such writer of
        the table, before it reads the table: once it has read it, an ALTER TABLE of the other
        would wait for its commit while its own ALTER waits for the other's (a deadlock).
        """
        if self._locked:
            return
        s = scope.settings
        # Any kind of key ("2026-01-01", "bronx", "2026-01-01|bronx") is hashed to one lock.
        window = scope.window
        parts: list[str | None] = list(window.keys) if window and scope.pcols else [None]
        for key in sorted({sql.lock_key(s.schema, s.table, p) for p in parts}):
            self._rows(("SELECT pg_advisory_xact_lock($1)", [key]))
        if scope.staged.changes:
            self._rows(
                ("SELECT pg_advisory_xact_lock($1)", [sql.table_lock(s.schema, s.table, "schema")])
            )
        self._locked = True

    def count_window(self, scope: Scope) -> Counts:
        """Rows the window holds now (per partition of a range), once this writer holds it."""
        self._lock(scope)
        s = scope.settings
        if not scope.table_exists:
            if self._columns(s.schema, s.table) is not None:
                raise CommitConflict(f"a concurrent writer created table {_name(s)}")
            return {}
        target = _target(scope)
        if scope.cells:
            counts: Counts = dict(self._rows(sql.count_by_partition(target, scope.cells)))
        else:
            counts = {None: self._rows(sql.count_window(target, scope.region))[0][0]}
        # The count holds the table (an ALTER TABLE waits for this commit from here on): the
        # columns read now are the ones the batch is written into.
        if self._columns(s.schema, s.table) != self._described:
            raise CommitConflict(f"a concurrent writer changed the columns of {_name(s)}")
        return counts

    def _keys_table(self, scope: Scope) -> str:
        """The batch's distinct keys in a temporary table, for the server to join against."""
        if not self._keys:
            kc = batch_sql.quoted_columns(scope.key)
            duck, source = self.evaluator(), scope.staged.relation
            keys = duck.sql(f"SELECT DISTINCT {', '.join(kc)} FROM {source}").to_arrow_table()
            name = KEYS_PREFIX + uuid.uuid4().hex
            self.cur.adbc_ingest(name, keys, mode="create", temporary=True)
            self._keys = f"pg_temp.{quote(name)}"
            self._temp.append(self._keys)
            # Temporary tables are never auto-analysed; without statistics the join is guessed.
            self._run(f"ANALYZE {self._keys}")
            # DuckDB orders text by bytes, PostgreSQL by the column's collation ('B' < 'a' in C,
            # not in en_US): a text range could exclude a matching key, so ranges stop there.
            ordered = []
            for f in keys.schema:
                if pa.types.is_string(f.type) or pa.types.is_large_string(f.type):
                    break
                ordered.append(quote(f.name))
            bounds = ", ".join(f"min({c}), max({c})" for c in ordered)
            found = duck.execute(f"SELECT {bounds} FROM {source}").fetchall()[0] if ordered else ()
            if found and found[0] is not None:
                self._key_ranges = list(zip(found[::2], found[1::2], strict=True))
        return self._keys

    def count_keys(self, scope: Scope) -> tuple[Counts, int]:
        """For a merge, the window's rows whose key the batch holds, and those elsewhere."""
        if scope.settings.mode != "merge" or not scope.table_exists:
            return {}, 0
        self._lock(scope)
        keys = self._keys_table(scope)
        target, key, ranges = _target(scope), scope.key, self._key_ranges
        if scope.cells:
            q = sql.matched_by_partition(target, keys, key, ranges, scope.cells)
            matched: Counts = dict(self._rows(q))
            return matched, matched.pop(None, 0)
        q = sql.merge_counts(target, keys, key, ranges, scope.region)
        in_window, outside = self._rows(q)[0]
        return {None: in_window}, outside

    def keys_elsewhere_sample(self, scope: Scope) -> str:
        """A few target rows outside the window whose key the batch holds."""
        keys = self._keys_table(scope)
        q = sql.keys_outside_window_sample(
            _target(scope), keys, scope.key, self._key_ranges, scope.region
        )
        rows = self._rows(q)
        return format_sample([d[0] for d in self.cur.description or []], rows)

    def keys_elsewhere_at_commit(self, scope: Scope) -> int:
        """Target rows outside the window whose key the batch holds, counted right before commit.

        Under the table's keys lock, which every merge of the table takes here and holds until
        its commit: a writer that committed a shared key earlier has committed it before this
        count starts, so the count sees it (READ COMMITTED reads each statement afresh). Only
        this count and the commit wait for another merge; their writes run in parallel.
        """
        s = scope.settings
        self._rows(
            ("SELECT pg_advisory_xact_lock($1)", [sql.table_lock(s.schema, s.table, "keys")])
        )
        keys = self._keys_table(scope)
        q = sql.merge_counts(_target(scope), keys, scope.key, self._key_ranges, scope.region)
        return self._rows(q)[0][1]

    def claim(self, settings: WriteSettings) -> None:
        """Record the asset as the owner of its table, unless another writer just did.

        Two claims of one table meet on the owners table's key: the later waits for the
        earlier's commit, inserts nothing, and reads the earlier's record.
        """
        owners = owners_of(settings.schema)
        if not self._owners_exist:
            self._rows(("SELECT pg_advisory_xact_lock($1)", [sql.DDL_LOCK]))
            self._create_schema(settings.schema)
            self._run(
                f"CREATE TABLE IF NOT EXISTS {owners} (schema_key text, table_key text,"
                " asset_key text NOT NULL, PRIMARY KEY (schema_key, table_key))"
            )
        self._run(
            (
                f"INSERT INTO {owners} VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                [settings.schema.lower(), settings.table.lower(), settings.asset],
            )
        )
        owner = self._owner(settings, owners)
        if owner is not None:
            guards.refuse_other_owner(settings, self._where, owner, owners)

    def _create_schema(self, schema: str) -> None:
        """Create ``schema`` unless it exists (under the DDL lock, so no other writer races it).

        Not CREATE SCHEMA IF NOT EXISTS: that asks for CREATE on the database even for a
        schema that exists, which a role owning only its schema lacks.
        """
        if not self._rows(sql.schema_exists(schema)):
            self._run(f"CREATE SCHEMA {quote(schema)}")

    def owners_text(self) -> str:
        """The owners table holding the target's record, as SQL spells it."""
        return self._owners_at

    def _create(self, scope: Scope) -> None:
        if scope.table_exists:
            return
        self._rows(("SELECT pg_advisory_xact_lock($1)", [sql.DDL_LOCK]))
        s = scope.settings
        if self._columns(s.schema, s.table) is not None:
            # Another writer created it while this one waited for the lock: the batch was
            # fitted to no table, so it is fitted again to the one that writer created.
            raise CommitConflict(f"a concurrent writer created table {_name(s)}")
        self._create_schema(s.schema)
        columns = [(f.stored_name, DIALECT.type_sql(f.stored_type)) for f in self._fits]
        self._run(sql.create_table(_target(scope), columns))
        if s.partition_names:
            # Every count, delete, fingerprint and load of a window then reads only its rows.
            # One B-tree over the partition columns, time first: a time window is a range of
            # its leading column. A static or dynamic partition is its value's rows, scattered
            # over the table by the runs that wrote them, so a BRIN would not narrow it; the
            # B-tree finds them by equality. Its upkeep is paid per row copied, while the scan
            # it spares grows with the table (500k rows of 200 values: one value's DELETE took
            # 17-30 ms instead of 45-60 ms, the COPY of all of them 0.4-0.9 s more).
            self._run(sql.create_index(_target(scope), list(s.partition_names)))
        keys = [f for f in self._fits if f.stored_name in s.primary_key]
        # boolean has no BRIN operator class.
        if s.mode == "merge" and keys and not any(pa.types.is_boolean(f.stored_type) for f in keys):
            # A merge looks up its keys in the whole table; the block ranges' key bounds let it
            # read only the blocks whose keys overlap the batch's (for keys handed out in order).
            self._run(sql.create_key_ranges_index(_target(scope), [f.stored_name for f in keys]))

    def _copy(self, scope: Scope, rows: pa.Table) -> int:
        """Binary COPY of ``rows`` into the target, in this transaction."""
        s = scope.settings
        self.cur.adbc_ingest(s.table, rows, mode="append", db_schema_name=s.schema)
        return rows.num_rows

    def replace(self, scope: Scope, on_stage: Callable[[str], None]) -> int:
        """Delete the window (the whole table when unpartitioned), then COPY the batch in."""
        self._lock(scope)
        self._create(scope)
        if scope.region:
            self._run(sql.delete_window(_target(scope), scope.region))
        else:
            self._run(sql.delete_all(_target(scope)))
        on_stage("deleted")
        self._written = self._staged_rows()
        return self._copy(scope, self._written)

    def merge(self, scope: Scope, on_stage: Callable[[str], None]) -> int:
        """Delete the batch's keys (the whole window with delete_missing), COPY the batch in."""
        self._lock(scope)
        self._create(scope)
        settings, target = scope.settings, _target(scope)
        if settings.delete_missing and scope.region:
            self._run(sql.delete_window(target, scope.region))
        elif settings.delete_missing:
            self._run(sql.delete_all(target))
        else:
            keys = self._keys_table(scope)
            self._run(sql.delete_matching_keys(target, keys, scope.key, self._key_ranges))
        on_stage("deleted")
        rows = self._staged_rows()
        if settings.dedupe_order_by:
            columns = [f.stored_name for f in self._fits]
            query = batch_sql.dedupe(
                scope.staged.relation, scope.key, settings.dedupe_order_by, columns
            )
            rows = self.evaluator().sql(query).to_arrow_table().select(rows.column_names)
            rows = rows.cast(self._staged_rows().schema)
        self._written = rows
        return self._copy(scope, rows)

    def _staged_rows(self) -> pa.Table:
        if self._stored is None:
            raise RuntimeError("stage() must run before a write")
        return self._stored

    def fingerprints(self, scope: Scope) -> dict[str | None, tuple[int, int]]:
        """Count and hash sum of the window as this publish leaves it, per partition of a range.

        Hashed in the embedded DuckDB over the rows the window holds after the write, never on
        the server: the staged batch itself, plus, for an upsert, the window's rows it keeps
        (read back as Arrow). :meth:`fingerprint_table` hashes stored rows the same way, so a
        fingerprint is a function of the rows alone and equals DuckDB's for the same rows.
        """
        after = self._register(self._after(scope))
        columns = list(self._staged_rows().column_names)
        duck = self.evaluator()
        if scope.cells:
            q, p = duck_sql.partition_fingerprints(after, columns, scope.cells)
            return {k: (n, int(d)) for k, n, d in duck.execute(q, p).fetchall()}
        count, digest = duck.execute(*duck_sql.fingerprint(after, columns)).fetchall()[0]
        return {None: (count, int(digest))}

    def _after(self, scope: Scope) -> pa.Table | pa.RecordBatchReader:
        """The window's rows as the write leaves them."""
        s, target = scope.settings, _target(scope)
        if not _exact(self._table_cols or {}):
            # The table stores some value otherwise than staged (timestamp(3), character(n)).
            return self._read(target, s.schema, s.table, scope.region)
        written = self._written if self._written is not None else self._staged_rows()
        if s.mode != "merge" or s.delete_missing:
            return written
        # An upsert keeps the window's rows whose key the batch does not hold.
        kept = sql.rows_without_keys(
            target,
            list(written.column_names),
            self._keys_table(scope),
            scope.key,
            scope.region,
        )
        self._run(kept)
        rows = _as_stored(
            self.cur.fetch_arrow_table(),
            dict(zip(written.schema.names, written.schema.types, strict=True)),
        )
        return pa.concat_tables([written, rows.cast(written.schema)])

    def _register(self, rows: pa.Table | pa.RecordBatchReader) -> str:
        """Hand ``rows`` to the evaluator for this transaction; returns the quoted name."""
        name = BATCH_PREFIX + uuid.uuid4().hex
        self.evaluator().register(name, rows)
        self._registered.append(name)
        return quote(name)

    def _read(self, target: str, schema: str, table: str, region: Region) -> pa.RecordBatchReader:
        """Stream the window's rows (the whole table without one) as Arrow in stored types."""
        cols = self._columns(schema, table) or {}
        types = _arrow_types(cols, f"{schema}.{table}")
        self._run(sql.select_rows(target, list(cols), region))
        batches = (_as_stored(b, types) for b in self.cur.fetch_record_batch())
        return pa.RecordBatchReader.from_batches(pa.schema(list(types.items())), batches)

    def fingerprint_table(
        self,
        schema: str,
        table: str,
        partition_columns: PartitionColumns,
        window: WriteWindow | None,
    ) -> tuple[int, int] | None:
        """Count and hash sum of a table (or one window of it); ``None`` when it is absent.

        The stored rows are read as Arrow and hashed in the evaluator, as :meth:`fingerprints`
        hashes the rows a publish leaves.
        """
        cols = self._columns(schema, table)
        if cols is None:
            return None
        name = f"{schema}.{table}"
        region = region_of(window, partition_columns, lambda c: _arrow_type(cols, c, name), name)
        # The library's own table has a name no user table can have, so it skips that check.
        target = owners_of(schema) if table == OWNERS_TABLE else qualified(schema, table)
        rows = self._read(target, schema, table, region)
        name = BATCH_PREFIX + uuid.uuid4().hex
        duck = self.evaluator()
        duck.register(name, rows)
        try:
            found = duck.execute(*duck_sql.fingerprint(quote(name), list(cols))).fetchall()
        finally:
            duck.unregister(name)
        count, digest = found[0]
        return count, int(digest)

    def load(
        self, settings: WriteSettings, window: WriteWindow | None, nothing: bool, arrow: bool
    ) -> pa.Table | pd.DataFrame:
        """The window's rows (the whole table without one), in partition order."""
        cols = self._columns(settings.schema, settings.table) or {}
        types = _arrow_types(cols, _name(settings))
        pcols = settings.partition_names
        window = None if nothing else window
        region = region_of(window, settings.partition_columns, types.__getitem__, _name(settings))
        target = qualified(settings.schema, settings.table)
        self._run(sql.select_window(target, pcols, region, nothing))
        table = _as_stored(self.cur.fetch_arrow_table(), types)
        return table if arrow else table.to_pandas()


def _target(scope: Scope) -> str:
    return qualified(scope.settings.schema, scope.settings.table)


def _name(settings: WriteSettings) -> str:
    return f"{settings.schema}.{settings.table}"


def _name_sql(settings: WriteSettings) -> str:
    return qualified(settings.schema, settings.table)


#: A timestamp unit's fractional second digits.
_UNIT_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}


def _roundings(fits: Sequence[ColumnFit], cols: dict[str, str]) -> tuple[Rounding, ...]:
    """The table's timestamp columns that keep fewer fractional digits than the batch sends."""
    found = []
    for fit in fits:
        digits = timestamp_digits(cols.get(fit.stored_name, ""))
        if (
            digits is not None
            and pa.types.is_timestamp(fit.type)
            and digits < _UNIT_DIGITS[fit.type.unit]
        ):
            found.append(Rounding(fit.name, fit.stored_name, digits, cols[fit.stored_name]))
    return tuple(found)


#: Column types that store a value otherwise than the staged batch holds it: fractional
#: seconds rounded to fewer digits, text padded to its length.
_INEXACT = re.compile(r"(timestamp|time)\([0-5]\)|character\(")


def _exact(cols: dict[str, str]) -> bool:
    """Whether every column stores exactly the staged value (so the batch is the stored rows)."""
    return not any(_INEXACT.match(kind) for kind in cols.values())


def _arrow_type(cols: dict[str, str], name: str, table: str) -> pa.DataType:
    found = arrow_type(cols[name])
    if found is None:
        raise SchemaMismatchError(
            f"Refused: column {table}.{name} is {cols[name]}, a PostgreSQL type this backend does"
            " not read or write. Nothing was changed. Fix: store it as a type the binary COPY"
            f" maps to Arrow, e.g. ALTER TABLE {table} ALTER COLUMN {DIALECT.sql_name(name)}"
            f" TYPE text USING {DIALECT.sql_name(name)}::text."
        )
    return found


def _arrow_types(cols: dict[str, str], table: str) -> dict[str, pa.DataType]:
    return {name: _arrow_type(cols, name, table) for name in cols}


def _as_stored(rows: T, types: dict[str, pa.DataType]) -> T:
    """Fetched rows in the table's Arrow types, without the driver's field metadata."""
    columns = []
    for name, column in zip(rows.column_names, rows.columns, strict=True):
        if isinstance(column.type, pa.BaseExtensionType):
            # numeric arrives as its text; Arrow parses it into the declared decimal.
            column = _storage(column)
        columns.append(column.cast(types[name]) if name in types else column)
    return type(rows).from_arrays(columns, names=rows.column_names)


def _storage(column: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    if isinstance(column, pa.ChunkedArray):
        storage = [chunk.storage for chunk in column.chunks]
        return pa.chunked_array(storage, column.type.storage_type)
    return column.storage


def _database_failed(where: str) -> str:
    return (
        f"Publishing {where} failed inside the database. The write is one transaction, so the"
        " window holds its previous rows (or, if the commit reached the server before the"
        " failure, this whole batch), never a mix. Fix the cause named above, then rerun the"
        " partition: free disk space for 'No space left on device'; grant the login INSERT,"
        " DELETE and CREATE for 'permission denied'; let the other writer finish for a lock"
        " timeout or a serialization failure."
    )
