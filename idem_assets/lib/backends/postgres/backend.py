"""The PostgreSQL backend: one transaction per publish, binary COPY of Arrow, per-partition locks.

The refusals are the guards' (:mod:`idem_assets.lib.write.guards`), decided on the staged Arrow
batch in an embedded DuckDB: nothing goes to the server before they pass, except the batch's keys
for a merge (a temporary table the transaction drops). Writers of one window queue on transaction-
scoped advisory locks, one per partition, taken in sorted order, so two writers of a partition can
never double it while writers of other partitions run in parallel; readers are never blocked. Rows
travel to the server as Arrow over the ADBC driver's binary COPY, and a window read streamed comes
back through a server-side cursor, a bounded batch at a time.
"""

import itertools
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

import adbc_driver_postgresql.dbapi as adbc
import pyarrow as pa
from adbc_driver_postgresql import StatementOptions

from idem_assets.lib.backends.postgres import sql
from idem_assets.lib.backends.postgres.types import (
    PostgresTypes,
    arrow_type,
    text_lengths,
    timestamp_digits,
)
from idem_assets.lib.model import expressions
from idem_assets.lib.model.errors import ConfigurationError, SchemaMismatchError
from idem_assets.lib.model.identifiers import qualified, quote, validate_identifier
from idem_assets.lib.model.settings import WriteSettings
from idem_assets.lib.model.windows import Region, WriteWindow, stored_region
from idem_assets.lib.sql import statements
from idem_assets.lib.sql.predicates import Statement, has_expression
from idem_assets.lib.sql.statements import Rel
from idem_assets.lib.write.evaluator import Counted as _Counted
from idem_assets.lib.write.evaluator import StagedRows, embedded, embedded_database, staged_rows
from idem_assets.lib.write.schema_fit import StoredDigits, change_sql
from idem_assets.lib.write.seam import (
    Capabilities,
    CommitConflict,
    Counts,
    Fingerprints,
    Fitted,
    PartitionColumns,
    Scope,
    Snapshot,
    Staged,
    StoredColumn,
    Summary,
    TableRef,
    WritePlan,
    Written,
    selected_columns,
)
from idem_assets.lib.write.streams import SpillArea, Spilled

if TYPE_CHECKING:
    # Only the annotations name pandas: importing it costs a run worker about a second.
    import pandas as pd

#: The library's own names are not plain identifiers, so no asset, schema or column can be
#: given one (validate_identifier refuses them) and shadow or be shadowed by them.
KEYS_PREFIX = "idem-keys-"
#: Each schema records which asset writes which of its tables in a table of its own, so a role
#: that owns only its schema keeps the record where it can write.
OWNERS_TABLE = "idem-table-owners"
#: Where the records were kept before: one found there is still honoured.
LEGACY_OWNERS_SCHEMA = "public"
#: A streamed read's server-side cursor: a name no user's cursor has.
CURSOR_PREFIX = "idem-read-"
#: A streamed read's first FETCH: enough rows to measure their width, few enough for any row.
FIRST_FETCH_ROWS = 1_000
#: What each later FETCH of a streamed read aims to bring as Arrow; libpq holds about four times
#: as much while the driver converts it.
FETCH_BYTES = 4 * 2**20
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


CAPABILITIES = Capabilities(
    engine="Postgres",
    types=DIALECT,
    commit="transaction",
    # The server rounds a finer timestamp to a timestamp(n) column's digits; staging rounds
    # the same way, so the guards judge the stored values.
    timestamps="round",
    text_holds_nul=False,
    max_name_bytes=DIALECT.name_bytes,
    recheck_keys_at_commit=True,
    expression_dialect="postgres",
)


class PostgresBackend:
    """Publishes through one open ADBC connection; the caller owns (and closes) it."""

    capabilities: ClassVar[Capabilities] = CAPABILITIES

    def __init__(self, conn: adbc.Connection) -> None:
        """Wrap ``conn``; nothing is read until a publish asks."""
        self.conn = conn
        self.cur = conn.cursor()

    def close(self) -> None:
        """Close the cursor (not the connection)."""
        self.cur.close()

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

    def _run(self, statement: str | Statement) -> None:
        _execute(self.cur, statement)

    def _rows(self, statement: str | Statement) -> list[tuple[Any, ...]]:
        self._run(statement)
        return self.cur.fetchall()

    def spill_area(self) -> SpillArea:
        """A streamed batch is staged in the embedded DuckDB, in a file once it is big.

        The write scans the copy once, for the server's COPY: a compressed file is read back
        with less work than a table evicted to DuckDB's temporary files.
        """
        return SpillArea(embedded_database(), temporary=False, files=True)

    @contextmanager
    def begin(self, where: str) -> Iterator["PostgresTransaction"]:
        """One transaction: COMMIT when the body returns, ROLLBACK when it raises."""
        # Ends whatever a read before this left open, so the publish starts a transaction anew.
        self.conn.rollback()
        tx = PostgresTransaction(self.cur, where)
        failed = False
        try:
            yield tx
            for name in tx.temp:
                # Dropped inside the transaction, so a commit leaves nothing behind.
                self._run(f"DROP TABLE IF EXISTS {name}")
            self.conn.commit()
        except BaseException as exc:
            failed = True
            try:
                self.conn.rollback()
            except adbc.Error:
                # A broken connection has ended the transaction: report what got us here.
                pass
            if isinstance(exc, adbc.Error):
                exc.add_note(_database_failed(where))
            raise
        finally:
            tx.close(failed)

    def _columns(self, schema: str, table: str) -> dict[str, str] | None:
        rows = self._rows(sql.table_columns(schema, table))
        return dict(rows) if rows else None

    def _read(self, target: Rel, cols: dict[str, str], region: Region) -> pa.RecordBatchReader:
        """Stream the window's rows (the whole table without one) as Arrow in stored types."""
        return _read(self.cur, target, cols, region)

    def fingerprint(
        self, table: TableRef, partition_columns: PartitionColumns, window: WriteWindow | None
    ) -> tuple[int, int] | None:
        """Count and hash sum of a table (or one window of it); ``None`` when it is absent.

        The stored rows are read as Arrow and hashed in the evaluator, as a publish hashes the
        rows it leaves: a fingerprint is a function of the rows alone, equal to DuckDB's.
        """
        cols = self._columns(table.schema, table.table)
        if cols is None:
            return None
        types = _arrow_types(cols, table.name)
        region = stored_region(window, partition_columns, types, table.name)
        # The library's own table has a name no user table can have, so it skips that check.
        rows = self._read((table.schema, table.table), cols, region)
        evaluator = embedded()
        try:
            name = evaluator.register(rows)
            found = evaluator.one(statements.fingerprint(name.strip('"'), list(cols)))
        finally:
            evaluator.release()
            evaluator.conn.close()
        count, digest = found
        return count, int(digest)

    def load(
        self,
        settings: WriteSettings,
        window: WriteWindow | None,
        nothing: bool = False,
        arrow: bool = True,
        columns: Sequence[str] | None = None,
        stream: bool = False,
    ) -> "pa.Table | pd.DataFrame | pa.RecordBatchReader | None":
        """The window's rows (the whole table without one), in partition order."""
        cols = self._columns(settings.schema, settings.table)
        if cols is None:
            return None
        types = _arrow_types(cols, _name(settings))
        region = stored_region(
            None if nothing else window, settings.partition_columns, types, _name(settings)
        )
        by_lower = {c.lower(): c for c in cols}
        order = [by_lower.get(c.lower(), c) for c in settings.partition_names]
        target = (settings.schema, settings.table)
        names = selected_columns(columns, cols)
        query = statements.select_window(target, names, region, order, nothing, dialect="postgres")
        if stream:
            batches = _streamed(self.cur, query, types)
            # The first FETCH now: the read fails here if it fails, and the rows name the schema.
            first = next(batches, None)
            schema = (
                first.schema
                if first is not None
                else pa.schema([(c, types[c]) for c in (names or list(cols))])
            )
            head = [] if first is None else [first]
            return pa.RecordBatchReader.from_batches(schema, itertools.chain(head, batches))
        self._run(query)
        table = _as_stored(self.cur.fetch_arrow_table(), types)
        return table if arrow else table.to_pandas()


def _execute(cur: Any, statement: str | Statement) -> None:
    query, params = (statement, []) if isinstance(statement, str) else statement
    cur.execute(query, params or None)


def _read(cur: Any, target: Rel, cols: dict[str, str], region: Region) -> pa.RecordBatchReader:
    """Stream a table's rows (one window of it) as Arrow in its stored types."""
    types = _arrow_types(cols, ".".join(target) if isinstance(target, tuple) else target)
    query = statements.select_window(target, list(cols), region, dialect="postgres")
    return pa.RecordBatchReader.from_batches(
        pa.schema(list(types.items())), _streamed(cur, query, types)
    )


def _streamed(
    cur: Any, query: Statement, types: dict[str, pa.DataType]
) -> Iterator[pa.RecordBatch]:
    """The rows of ``query`` in batches of about :data:`FETCH_BYTES`, in their stored types.

    The driver streams a result only through COPY, which binds no values: a query with bound
    values comes back whole, every row held by libpq and then converted as one Arrow batch
    (a 2M-row window took 510 MB in libpq for 115 MB of Arrow). A server-side cursor keeps the
    values bound and the rows on the server until fetched. It is declared now, in the
    transaction ``cur`` is in, so the rows are those of this moment and an error is raised
    here; the cursor closes with the last batch, or else with the transaction.
    """
    if not query.params:
        # Nothing bound (the whole table): the driver's COPY streams it, ``cur`` busy till read.
        _execute(cur, query)
        return (_as_stored(b, types) for b in cur.fetch_record_batch())
    name = CURSOR_PREFIX + uuid.uuid4().hex
    _execute(cur, sql.declare_cursor(name, query))
    return _fetched(cur.connection, name, types)


def _fetched(conn: Any, name: str, types: dict[str, pa.DataType]) -> Iterator[pa.RecordBatch]:
    """Fetch cursor ``name`` to its end: a few rows first, to size the rest by their width."""
    # A statement of its own, kept off COPY, which cannot copy a FETCH out.
    fetch = conn.cursor(adbc_stmt_kwargs={StatementOptions.USE_COPY.value: "false"})
    try:
        rows = FIRST_FETCH_ROWS
        while True:
            fetch.execute(sql.fetch_forward(name, rows))
            got = size = 0
            for batch in fetch.fetch_record_batch():
                got, size = got + batch.num_rows, size + batch.nbytes
                yield _as_stored(batch, types)
            if got < rows:
                break
            rows = max(1, FETCH_BYTES * got // max(size, 1))
        fetch.execute(sql.close_cursor(name))
    finally:
        fetch.close()


class PostgresTransaction:
    """One publish's transaction on the connection; its evaluator is an embedded DuckDB."""

    def __init__(self, cur: Any, where: str) -> None:
        """Work through ``cur`` in the transaction the backend began."""
        self.cur = cur
        self.where = where
        self.evaluator = embedded()
        self.committed: dict[str, Any] = {}
        #: Temporary tables to drop before the commit.
        self.temp: list[str] = []
        self._cols: dict[str, str] | None = None
        self._described: dict[str, str] | None = None
        self._owners_exist = False
        self._owners_at = ""
        self._stored: StagedRows | None = None
        self._keys = ""
        self._key_ranges: list[tuple[Any, Any]] = []
        self._locked = False

    def close(self, failed: bool) -> None:
        """Unregister the staged rows and close the evaluator's cursor."""
        self.evaluator.release(failed)
        self.evaluator.conn.close()

    def _run(self, statement: str | Statement) -> None:
        _execute(self.cur, statement)

    def _rows(self, statement: str | Statement) -> list[tuple[Any, ...]]:
        self._run(statement)
        return self.cur.fetchall()

    def _columns(self, schema: str, table: str) -> dict[str, str] | None:
        rows = self._rows(sql.table_columns(schema, table))
        return dict(rows) if rows else None

    def describe(self, settings: WriteSettings) -> Snapshot:
        """One catalog query for the table's columns and the owners tables."""
        s = settings
        rows = self._rows(sql.describe(OWNERS_TABLE, LEGACY_OWNERS_SCHEMA, s.schema, s.table))
        kinds = {kind for kind, _, _ in rows}
        self._cols = {name: t for kind, name, t in rows if kind == 0} or None
        self._described = dict(self._cols) if self._cols else None
        self._owners_exist = 1 in kinds
        self._owners_at = owners_of(s.schema)
        owner = self._owner(settings, self._owners_at) if 1 in kinds else None
        if owner is None and 2 in kinds:
            owner = self._owner(settings, owners_of(LEGACY_OWNERS_SCHEMA))
            if owner is not None:
                self._owners_at = owners_of(LEGACY_OWNERS_SCHEMA)
        cols = self._cols or {}
        lengths = text_lengths(cols)
        columns = {
            c: StoredColumn(
                arrow_type(kind),
                kind,
                digits=timestamp_digits(kind),
                length=lengths[c][0] if c in lengths else None,
            )
            for c, kind in cols.items()
        }
        digits = {
            c: self._digits(settings, c)
            for c, kind in cols.items()
            if arrow_type(kind) is None and kind == "numeric"
        }
        return Snapshot(
            table=TableRef.of(s),
            columns=columns if self._cols is not None else None,
            owner=owner,
            handover=(
                f"UPDATE {self._owners_at} SET asset_key = '{{asset}}' WHERE schema_key ="
                f" '{s.schema.lower()}' AND table_key = '{s.table.lower()}'"
            ),
            numeric_digits=digits,
        )

    def _owner(self, settings: WriteSettings, owners: str) -> str | None:
        found = self._rows(
            Statement(
                f"SELECT asset_key FROM {owners} WHERE schema_key = $1 AND table_key = $2",
                [settings.schema.lower(), settings.table.lower()],
            )
        )
        return found[0][0] if found else None

    def _digits(self, settings: WriteSettings, column: str) -> StoredDigits:
        """The digits the values of a ``numeric`` column without precision need."""
        found = self._rows(sql.numeric_digits(_name_sql(settings), column))[0]
        return StoredDigits(found[0] or 0, found[1] or 0, found[2] is not False)

    def stage(self, batch: pa.Table | Spilled, fitted: Fitted) -> Staged:
        """The batch cast to the stored names, types and rounding in Arrow, for the guards."""
        self._stored = staged_rows(self.evaluator, batch, fitted)
        sent = ""
        if fitted.rounds:
            sent = batch.relation if isinstance(batch, Spilled) else self.evaluator.register(batch)
        return Staged(relation=self._stored.relation, evaluator=self.evaluator, sent=sent)

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
            self._rows(Statement("SELECT pg_advisory_xact_lock($1)", [key]))
        if scope.fitted.changes:
            lock = sql.table_lock(s.schema, s.table, "schema")
            self._rows(Statement("SELECT pg_advisory_xact_lock($1)", [lock]))
        self._locked = True

    def summarize(self, scope: Scope, final: bool = False) -> Summary:
        """The window's counts once this writer holds it; for a merge, its keys' too."""
        if final:
            return self._keys_at_commit(scope)
        self._lock(scope)
        s = scope.settings
        if not scope.table_exists:
            if self._columns(s.schema, s.table) is not None:
                raise CommitConflict(f"a concurrent writer created table {_name(s)}")
            return Summary()
        target = _target(scope)
        if scope.cells:
            existing: Counts = dict(
                self._rows(statements.count_by_partition(target, scope.cells, dialect=_PG))
            )
        else:
            counted = statements.count_window(target, scope.region, dialect=_PG)
            existing = {None: self._rows(counted)[0][0]}
        # The count holds the table (an ALTER TABLE waits for this commit from here on): the
        # columns read now are the ones the batch is written into.
        if self._columns(s.schema, s.table) != self._described:
            raise CommitConflict(f"a concurrent writer changed the columns of {_name(s)}")
        if s.mode != "merge":
            return Summary(existing=existing)
        keys, key, ranges = self._keys_table(scope), scope.key, self._key_ranges
        if scope.cells:
            q = statements.matched_by_partition(target, keys, key, scope.cells, ranges, dialect=_PG)
            matched: Counts = dict(self._rows(q))
            elsewhere = matched.pop(None, 0)
        else:
            q = statements.merge_counts(target, keys, key, scope.region, ranges, dialect=_PG)
            in_window, elsewhere = self._rows(q)[0]
            matched = {None: in_window}
        return Summary(existing, matched, elsewhere, self._sample(scope) if elsewhere else None)

    def _keys_at_commit(self, scope: Scope) -> Summary:
        """Target rows outside the window whose key the batch holds, counted right before commit.

        Under the table's keys lock, which every merge of the table takes here and holds until
        its commit: a writer that committed a shared key earlier has committed it before this
        count starts, so the count sees it (READ COMMITTED reads each statement afresh). Only
        this count and the commit wait for another merge; their writes run in parallel.
        """
        s = scope.settings
        lock = sql.table_lock(s.schema, s.table, "keys")
        self._rows(Statement("SELECT pg_advisory_xact_lock($1)", [lock]))
        keys = self._keys_table(scope)
        q = statements.merge_counts(
            _target(scope), keys, scope.key, scope.region, self._key_ranges, dialect=_PG
        )
        elsewhere = self._rows(q)[0][1]
        return Summary(elsewhere=elsewhere, sample=self._sample(scope) if elsewhere else None)

    def _sample(self, scope: Scope) -> pa.Table:
        """A few target rows outside the window whose key the batch holds."""
        q = statements.keys_outside_window_sample(
            _target(scope),
            self._keys_table(scope),
            scope.key,
            scope.region,
            self._key_ranges,
            dialect=_PG,
        )
        self._run(q)
        return self.cur.fetch_arrow_table()

    def _keys_table(self, scope: Scope) -> Rel:
        """The batch's distinct keys in a temporary table, for the server to join against."""
        if not self._keys:
            kc = ", ".join(quote(k) for k in scope.key)
            source = scope.staged.relation
            # Read as they go: a streamed merge's keys need not fit in memory.
            keys = self.evaluator.reader(f"SELECT DISTINCT {kc} FROM {source}")
            name = KEYS_PREFIX + uuid.uuid4().hex
            self.cur.adbc_ingest(name, keys, mode="create", temporary=True)
            self._keys = name
            self.temp.append(f"pg_temp.{quote(name)}")
            # Temporary tables are never auto-analysed; without statistics the join is guessed.
            self._run(f"ANALYZE pg_temp.{quote(name)}")
            # DuckDB orders text by bytes, PostgreSQL by the column's collation ('B' < 'a' in C,
            # not in en_US): a text range could exclude a matching key, so ranges stop there.
            ordered = []
            for f in keys.schema:
                if pa.types.is_string(f.type) or pa.types.is_large_string(f.type):
                    break
                ordered.append(quote(f.name))
            bounds = ", ".join(f"min({c}), max({c})" for c in ordered)
            found = self.evaluator.one(f"SELECT {bounds} FROM {source}") if ordered else ()
            if found and found[0] is not None:
                self._key_ranges = list(zip(found[::2], found[1::2], strict=True))
        return ("pg_temp", self._keys)

    def _claim(self, settings: WriteSettings) -> str | None:
        """Record the asset as the owner of its table; the owner recorded after (it may differ).

        Two claims of one table meet on the owners table's key: the later waits for the
        earlier's commit, inserts nothing, and reads the earlier's record.
        """
        owners = owners_of(settings.schema)
        if not self._owners_exist:
            self._rows(Statement("SELECT pg_advisory_xact_lock($1)", [sql.DDL_LOCK]))
            self._create_schema(settings.schema)
            self._run(
                f"CREATE TABLE IF NOT EXISTS {owners} (schema_key text, table_key text,"
                " asset_key text NOT NULL, PRIMARY KEY (schema_key, table_key))"
            )
        self._run(
            Statement(
                f"INSERT INTO {owners} VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
                [settings.schema.lower(), settings.table.lower(), settings.asset],
            )
        )
        return self._owner(settings, owners)

    def _create_schema(self, schema: str) -> None:
        """Create ``schema`` unless it exists (under the DDL lock, so no other writer races it).

        Not CREATE SCHEMA IF NOT EXISTS: that asks for CREATE on the database even for a
        schema that exists, which a role owning only its schema lacks.
        """
        if not self._rows(sql.schema_exists(schema)):
            self._run(f"CREATE SCHEMA {quote(schema)}")

    def _create(self, scope: Scope) -> None:
        self._rows(Statement("SELECT pg_advisory_xact_lock($1)", [sql.DDL_LOCK]))
        s = scope.settings
        if self._columns(s.schema, s.table) is not None:
            # Another writer created it while this one waited for the lock: the batch was
            # fitted to no table, so it is fitted again to the one that writer created.
            raise CommitConflict(f"a concurrent writer created table {_name(s)}")
        self._create_schema(s.schema)
        fits = scope.fitted.columns
        columns = [(f.stored_name, DIALECT.type_sql(f.stored_type)) for f in fits]
        self._run(sql.create_table(_name_sql(s), columns))
        indexed = [c for c in s.partition_names if not expressions.is_expression(c)]
        if indexed:
            # Every count, delete, fingerprint and load of a window then reads only its rows.
            # One B-tree over the partition columns, time first: a time window is a range of
            # its leading column. A static or dynamic partition is its value's rows, scattered
            # over the table by the runs that wrote them, so a BRIN would not narrow it; the
            # B-tree finds them by equality. Its upkeep is paid per row copied, while the scan
            # it spares grows with the table (500k rows of 200 values: one value's DELETE took
            # 17-30 ms instead of 45-60 ms, the COPY of all of them 0.4-0.9 s more). A
            # partition_expr expression is not indexed: PostgreSQL indexes only IMMUTABLE
            # expressions, and its casts of text to dates depend on DateStyle.
            self._run(sql.create_index(_name_sql(s), indexed))
        keys = [f for f in fits if f.stored_name in s.primary_key]
        # boolean has no BRIN operator class.
        if s.mode == "merge" and keys and not any(pa.types.is_boolean(f.stored_type) for f in keys):
            # A merge looks up its keys in the whole table; the block ranges' key bounds let it
            # read only the blocks whose keys overlap the batch's (for keys handed out in order).
            self._run(sql.create_key_ranges_index(_name_sql(s), [f.stored_name for f in keys]))

    def write(self, plan: WritePlan, on_stage: Callable[[str], None]) -> Written:
        """Claim, create, change the schema, delete the window's rows, COPY the batch in."""
        scope = plan.scope
        self._lock(scope)
        settings, target = scope.settings, _target(scope)
        owner = self._claim(settings) if plan.claim else None
        for change in scope.fitted.changes:
            self._run(change_sql(_name_sql(settings), change, DIALECT))
        if self._cols is not None:
            self._cols |= {c.column: DIALECT.type_sql(c.type) for c in scope.fitted.changes}
        if plan.create:
            self._create(scope)
        if settings.mode == "overwrite" or settings.delete_missing:
            if scope.region:
                self._run(statements.delete_window(target, scope.region, dialect=_PG))
            else:
                # DELETE, not TRUNCATE: TRUNCATE's lock would block every reader until commit.
                self._run(statements.delete_all(target, dialect=_PG))
        else:
            keys = self._keys_table(scope)
            self._run(
                statements.delete_matching_keys(
                    target, keys, scope.key, self._key_ranges, dialect=_PG
                )
            )
        on_stage("deleted")
        staged = self._staged_rows()
        names = list(staged.schema.names)
        written = staged.relation
        if settings.mode == "merge" and settings.dedupe_order_by:
            q = statements.dedupe(_source(scope), scope.key, settings.dedupe_order_by, names)
            written = self.evaluator.view(q)
        total = staged.num_rows if written == staged.relation else None
        rows = _Counted(staged.reader(written), plan.progress, CAPABILITIES.engine, total)
        self.cur.adbc_ingest(
            settings.table, rows.reader(), mode="append", db_schema_name=settings.schema
        )
        return Written(
            rows=rows.rows,
            fingerprints=self._fingerprints(scope, written.strip('"'), names),
            owner=owner,
            placed=self._placed(scope),
        )

    def _placed(self, scope: Scope) -> Counts | None:
        """The window's rows as the server's SQL places them, when an expression places them.

        The guards judged the batch with the expression in DuckDB's SQL; the server evaluates
        its own spelling, and the publish compares the two counts before it commits.
        """
        if not has_expression(scope.region):
            return None
        target = _target(scope)
        if scope.cells:
            q = statements.count_by_partition(target, scope.cells, dialect=_PG)
            return dict(self._rows(q))
        return {None: self._rows(statements.count_window(target, scope.region, dialect=_PG))[0][0]}

    def _staged_rows(self) -> StagedRows:
        if self._stored is None:
            raise RuntimeError("stage() must run before a write")
        return self._stored

    def _fingerprints(self, scope: Scope, written: str, names: list[str]) -> Fingerprints:
        """Count and hash sum of the window as this publish leaves it, per partition of a range.

        Hashed in the embedded DuckDB over the rows the window holds after the write, never on
        the server: the rows written, plus, for an upsert, the window's rows it keeps (read
        back as Arrow). :meth:`PostgresBackend.fingerprint` hashes stored rows the same way.
        """
        after = self._after(scope, written, names)
        if scope.cells:
            q = statements.partition_fingerprints(after, names, scope.cells)
            return {k: (n, int(d)) for k, n, d in self.evaluator.rows(q)}
        count, digest = self.evaluator.one(statements.fingerprint(after, names))
        return {None: (count, int(digest))}

    def _after(self, scope: Scope, written: str, names: list[str]) -> str:
        """A relation of the evaluator holding the window's rows as the write leaves them."""
        s, target = scope.settings, _target(scope)
        cols = self._cols or {}
        if not _exact(cols):
            # The table stores some value otherwise than staged (timestamp(3), character(n)).
            current = self._columns(s.schema, s.table) or {}
            return self.evaluator.register(_read(self.cur, target, current, scope.region)).strip(
                '"'
            )
        if s.mode != "merge" or s.delete_missing:
            return written
        # An upsert keeps the window's rows whose key the batch does not hold.
        kept = statements.rows_without_keys(
            target, names, self._keys_table(scope), scope.key, scope.region, dialect=_PG
        )
        schema = self._staged_rows().schema
        types = dict(zip(schema.names, schema.types, strict=True))
        found = (b.cast(schema) for b in _streamed(self.cur, kept, types))
        others = self.evaluator.register(pa.RecordBatchReader.from_batches(schema, found))
        cols = ", ".join(quote(c) for c in names)
        # Read once, by the one fingerprint statement: the kept rows' reader cannot rewind.
        union = f"SELECT {cols} FROM {quote(written)} UNION ALL SELECT {cols} FROM {others}"
        return self.evaluator.view(union).strip('"')


_PG = "postgres"


def _target(scope: Scope) -> Rel:
    return (scope.settings.schema, scope.settings.table)


def _source(scope: Scope) -> str:
    """The staged relation as the statements take it (its name unquoted)."""
    return scope.staged.relation.strip('"')


def _name(settings: WriteSettings) -> str:
    return f"{settings.schema}.{settings.table}"


def _name_sql(settings: WriteSettings) -> str:
    return qualified(settings.schema, settings.table)


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
