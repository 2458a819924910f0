"""The Iceberg backend: one Iceberg commit (one snapshot) per publish, decided by the guards.

An Iceberg table has no multi-statement transaction: a write is one optimistic commit of a new
metadata file, a compare-and-swap in the catalog. So the publish loads the table once (every read
and the commit use that snapshot), fits the batch to it on Arrow types (:mod:`.types`), the guards
judge the staged batch in the embedded DuckDB, and the write is held back until the transaction
ends, where it becomes one OVERWRITE snapshot (:mod:`.commit`). A crash at any stage before that
commit leaves main where it was; a commit that loses to a concurrent writer raises
:class:`~idem_assets.lib.write.seam.CommitConflict`, and the publish starts over on the new
snapshot.

Counts come from the manifests: a file whose partition lies inside the window counts its
``record_count`` without a read (:mod:`.files`). Layout: namespace ``<schema>``, table
``<table>`` (lower-cased), partitioned by the time column's day and each category column. The
owner is the table property :data:`~.commit.OWNER_PROPERTY`, set in the commit that writes data.

With ``audit`` checks the publish is a write-audit-publish on a branch (:mod:`.audit_branch`).
"""

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.expressions import BooleanExpression
from pyiceberg.table import Table as IcebergTable

from idem_assets.lib.backends.iceberg import files
from idem_assets.lib.backends.iceberg.catalog import IcebergLocation, release
from idem_assets.lib.backends.iceberg.commit import (
    ASSET_SUMMARY,
    OWNER_PROPERTY,
    PARTITIONS_SUMMARY,
    Change,
    create,
    lost,
    stage,
    without_retry,
)
from idem_assets.lib.backends.iceberg.expressions import box_filter, region_filter
from idem_assets.lib.backends.iceberg.types import ICEBERG_TYPES, arrow_columns, promotable
from idem_assets.lib.dagster_layer.checks import Check
from idem_assets.lib.model.identifiers import quote, validate_identifier
from idem_assets.lib.model.settings import WriteSettings
from idem_assets.lib.model.windows import WriteWindow, stored_region
from idem_assets.lib.sql import statements
from idem_assets.lib.write.evaluator import (
    Counted,
    DuckDBEvaluator,
    StagedRows,
    embedded,
    reading,
    staged_rows,
)
from idem_assets.lib.write.schema_fit import evolved
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
from idem_assets.lib.write.streams import Spilled

if TYPE_CHECKING:
    # Only the annotations name pandas: importing it costs a run worker about a second.
    import pandas as pd

_PREFIX = "idem-iceberg-"

CAPABILITIES = Capabilities(
    engine="Iceberg",
    types=ICEBERG_TYPES,
    commit="optimistic",
    writes_in_commit=True,
    # Staging floors timestamps to Iceberg's microseconds in Arrow: a floor keeps every row on
    # its side of a window bound, so the guards judge exactly the rows Iceberg stores.
    timestamps="floor",
    # Columns are added and types promoted in the snapshot's own commit, as far as Iceberg's
    # schema evolution promotes a type in place.
    schema_changes=frozenset({"add_column", "widen_type"}),
    widens=promotable,
    widens_only="from int to long, float to double, or a decimal to more digits of the same scale",
)


def identifier(schema: str, table: str) -> tuple[str, str]:
    """The catalog identifier of ``schema.table`` (lower-cased, as DuckDB compares names)."""
    validate_identifier(schema, "schema")
    validate_identifier(table, "table")
    return schema.lower(), table.lower()


class IcebergBackend:
    """Publishes to Iceberg tables of one catalog; call :meth:`close` (or use ``with``) after."""

    capabilities: ClassVar[Capabilities] = CAPABILITIES

    def __init__(self, location: IcebergLocation | Catalog, audit: Sequence[Check] = ()) -> None:
        """Open ``location``'s catalog; with ``audit``, publish through an audit branch."""
        self.location = location if isinstance(location, IcebergLocation) else None
        self.catalog = location.open() if isinstance(location, IcebergLocation) else location
        #: Whether this backend opened the catalog (and so releases it on exit).
        self._owns_catalog = self.location is not None
        self.audit = tuple(audit)
        #: Data files the last load planned (and read).
        self.files_read: int | None = None

    def __enter__(self) -> "IcebergBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the catalog's connections if this backend opened it."""
        if self._owns_catalog:
            release(self.catalog)

    def open(self, schema: str, table: str) -> IcebergTable | None:
        """The table's current metadata, ``None`` when the catalog has no such table."""
        try:
            return self.catalog.load_table(identifier(schema, table))
        except NoSuchTableError:
            return None

    @contextmanager
    def begin(self, where: str) -> Iterator["IcebergTransaction"]:
        """A fresh evaluator for the guards; the one Iceberg commit when the body returns."""
        tx = IcebergTransaction(self, where)
        failed = False
        try:
            yield tx
            try:
                tx.commit()
            except Exception as exc:
                if lost(exc):
                    raise CommitConflict(str(exc).split("\n")[0]) from exc
                raise
        except BaseException:
            failed = True
            raise
        finally:
            tx.close(failed)

    def _scan(
        self,
        table: IcebergTable,
        partition_columns: PartitionColumns,
        window: WriteWindow | None,
        read: Sequence[str] | None = None,
    ) -> pa.Table:
        """The window's rows (every row without one), reading only the files it can be in.

        ``read``: only these columns (with the window's), the files' others never decoded.
        """
        columns = arrow_columns(table.schema())
        region = stored_region(window, partition_columns, columns, ".".join(table.name()[-2:]))
        rows, self.files_read = files.region_rows(table, region, columns=read)
        return rows

    def fingerprint(
        self, table: TableRef, partition_columns: PartitionColumns, window: WriteWindow | None
    ) -> tuple[int, int] | None:
        """Count and hash sum of a table (or one window of it); ``None`` when it is absent."""
        found = self.open(table.schema, table.table)
        if found is None:
            return None
        rows = self._scan(found, partition_columns, window)
        with _reading() as ev:
            count, digest = ev.one(
                statements.fingerprint(ev.register(rows).strip('"'), rows.column_names)
            )
        return count, digest

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
        found = self.open(settings.schema, settings.table)
        if found is None:
            return None
        stored = arrow_columns(found.schema())
        by_lower = {c.lower(): c for c in stored}
        order = [by_lower.get(c.lower(), c) for c in settings.partition_names]
        names = selected_columns(columns, stored)
        # The files are read for the selected columns and those the window and order need.
        read = None if names is None else [*names, *(c for c in order if c not in names)]
        if stream:
            return self._streamed(found, settings, window, nothing, read, names, order)
        if nothing:
            rows = pa.table({c: pa.array([], t) for c, t in stored.items()})
        else:
            rows = self._scan(found, settings.partition_columns, window, read)
        if order:
            rows = rows.sort_by([(c, "ascending") for c in order])
        rows = rows if names is None else rows.select(names)
        return rows if arrow else rows.to_pandas()

    def _streamed(
        self,
        table: IcebergTable,
        settings: WriteSettings,
        window: WriteWindow | None,
        nothing: bool,
        read: Sequence[str] | None,
        names: Sequence[str] | None,
        order: Sequence[str],
    ) -> pa.RecordBatchReader:
        """The window read a data file at a time into the embedded DuckDB, then in order.

        Each file is filtered to the window as it is read, and DuckDB sorts the rows (spilling
        to disk past its memory limit), so no step holds the window whole.
        """
        stored = arrow_columns(table.schema())
        wanted = list(names) if names is not None else list(stored)
        schema = pa.schema([pa.field(c, stored[c]) for c in wanted])
        # The rows keep the columns they are sorted by until sorted, selected or not.
        held = [*wanted, *(c for c in order if c not in wanted)]
        held_schema = pa.schema([pa.field(c, stored[c]) for c in held])
        region = stored_region(
            None if nothing else window,
            settings.partition_columns,
            stored,
            ".".join(table.name()[-2:]),
        )
        tasks = [] if nothing else files.plan(table, region_filter(region, stored))
        columns = list(read) if read is not None else []

        def parts() -> Iterator[pa.RecordBatch]:
            for task in tasks:
                rows = files.in_region(files.read(table.metadata, table, [task], columns), region)
                full = rows.cast(pa.schema([pa.field(c, stored[c]) for c in rows.column_names]))
                yield from full.select(held).to_batches()

        sorted_by = ", ".join(quote(c) for c in order)
        selected = ", ".join(quote(c) for c in wanted)

        def query(ev: DuckDBEvaluator) -> str:
            relation = ev.create(pa.RecordBatchReader.from_batches(held_schema, parts()))
            return f"SELECT {selected} FROM {relation}" + (
                f" ORDER BY {sorted_by}" if order else ""
            )

        return reading(query, schema)


#: Rows of a streamed batch written as one table's files: fewer, larger data files than one
#: per batch DuckDB reads back, in bounded memory (about 60 MB of a trip's 8 columns).
FILE_ROWS = 1_048_576


def _grouped(reader: pa.RecordBatchReader, rows: int) -> Iterator[pa.Table]:
    """``reader``'s batches gathered into tables of about ``rows`` rows."""
    held: list[pa.RecordBatch] = []
    count = 0
    for batch in reader:
        held.append(batch)
        count += batch.num_rows
        if count >= rows:
            yield pa.Table.from_batches(held, reader.schema)
            held, count = [], 0
    if held:
        yield pa.Table.from_batches(held, reader.schema)


@contextmanager
def _reading() -> Iterator[DuckDBEvaluator]:
    """An evaluator for one read, released and closed after."""
    ev = embedded()
    try:
        yield ev
    finally:
        ev.release()
        ev.conn.close()


class IcebergTransaction:
    """One publish: reads one snapshot, and holds its write back as the commit at the end."""

    def __init__(self, backend: IcebergBackend, where: str) -> None:
        """Publish through ``backend`` (its catalog and audit checks)."""
        self.backend = backend
        self.where = where
        self.evaluator = embedded()
        self.committed: dict[str, Any] = {}
        self._identifier: tuple[str, str] | None = None
        self._table: IcebergTable | None = None
        #: Columns as a scan returns them, ``None`` without a table.
        self._columns: dict[str, pa.DataType] | None = None
        self._batch: StagedRows | None = None
        self._window_rows: str | None = None
        self._pending: Callable[[], IcebergTable] | None = None

    def close(self, failed: bool) -> None:
        """Drop what this publish registered in the embedded DuckDB, and close its cursor."""
        try:
            self.evaluator.release(failed)
        finally:
            self.evaluator.conn.close()

    def commit(self) -> None:
        """The held-back snapshot, committed; its id and the table's location go to metadata."""
        if self._pending is None:
            return
        table = self._pending()
        current = table.current_snapshot()
        self.committed = {
            "iceberg_snapshot_id": current.snapshot_id if current else None,
            "iceberg_table_location": table.location(),
            "iceberg_metadata_location": table.metadata_location,
        }

    def describe(self, settings: WriteSettings) -> Snapshot:
        """Load the table's current snapshot: every later read and the commit use it."""
        backend = self.backend
        self._identifier = identifier(settings.schema, settings.table)
        found = backend.open(settings.schema, settings.table)
        columns, owner = None, None
        if found is not None:
            without_retry(found)
            self._columns = arrow_columns(found.schema())
            columns = {
                c: StoredColumn(t, ICEBERG_TYPES.type_sql(t)) for c, t in self._columns.items()
            }
            owner = found.properties.get(OWNER_PROPERTY)
        self._table = found
        opened = "catalog" if backend.location is None else backend.location.code()
        # A table nobody owns is claimed by the commit of its rows (a property set with them).
        return Snapshot(
            table=TableRef.of(settings),
            columns=columns,
            owner=owner,
            handover=(
                "import os, urllib.parse, pyiceberg.catalog.sql, pyiceberg.catalog.rest; "
                f"{opened}.load_table({self._identifier!r}).transaction()"
                f".set_properties({{{OWNER_PROPERTY!r}: '{{asset}}'}}).commit_transaction()"
            ),
        )

    def stage(self, batch: pa.Table | Spilled, fitted: Fitted) -> Staged:
        """The batch cast to the stored names and types in Arrow, registered for the guards."""
        self._batch = staged_rows(self.evaluator, batch, fitted)
        return Staged(relation=self._batch.relation, evaluator=self.evaluator)

    def _existing(self) -> IcebergTable:
        assert self._table is not None, "only an existing table is read"
        return self._table

    def _window(self, scope: Scope) -> str:
        """The window's rows as the snapshot holds them, registered once per publish."""
        if self._window_rows is None:
            table = self._existing()
            tasks = files.plan(table, region_filter(scope.region, self._columns or {}))
            rows = files.in_region(files.read(table.metadata, table, tasks), scope.region)
            self._window_rows = self.evaluator.register(rows, _PREFIX).strip('"')
        return self._window_rows

    def _keyed(self, scope: Scope) -> str:
        """Target rows of files whose key bounds may hold a key of the batch, registered."""
        table = self._existing()
        key = scope.key
        touches = files.key_overlap(table.schema(), key[0], self._keys(scope).column(key[0]))
        tasks = [t for t in files.plan(table, region_filter((), {})) if touches(t.file)]
        rows = files.read(table.metadata, table, tasks)
        return self.evaluator.register(rows, _PREFIX).strip('"')

    def _counts(self, scope: Scope) -> Counts:
        """Rows the window holds: from the manifests' record counts where files lie inside it."""
        table = self._existing()
        types = self._columns or {}
        tasks = files.plan(table, region_filter(scope.region, types))
        cells: dict[str | None, BooleanExpression] = {
            key: box_filter(box, types) for key, box in scope.cells
        } or {None: region_filter(scope.region, types)}
        found, unread = files.counts(table.metadata, tasks, cells)
        if unread:
            # A file the window covers in part: count its rows in the window.
            target, ev = self._window(scope), self.evaluator
            if scope.cells:
                return dict(ev.rows(statements.count_by_partition(target, scope.cells)))
            return {None: ev.one(f"SELECT count(*) FROM {quote(target)}")[0]}
        if not scope.cells:
            return {None: found.get(None, 0)}
        return found

    def summarize(self, scope: Scope, final: bool = False) -> Summary:
        """Rows the window holds in the snapshot, and for a merge its keys' rows."""
        if not scope.table_exists:
            return Summary()
        existing = self._counts(scope)
        if scope.settings.mode != "merge":
            return Summary(existing=existing)
        ev, source, key = self.evaluator, scope.staged.relation.strip('"'), scope.key
        target = self._keyed(scope)
        if scope.cells:
            matched: Counts = dict(
                ev.rows(statements.matched_by_partition(target, source, key, scope.cells))
            )
            elsewhere = matched.pop(None, 0)
        else:
            in_window, elsewhere = ev.one(
                statements.merge_counts(target, source, key, scope.region)
            )
            matched = {None: in_window}
        sample = None
        if elsewhere and scope.pcols:
            sample = ev.arrow(
                statements.keys_outside_window_sample(target, source, key, scope.region)
            )
        return Summary(existing, matched, elsewhere, sample)

    def write(self, plan: WritePlan, on_stage: Callable[[str], None]) -> Written:
        """Hold back one snapshot: the window replaced, or the batch's keys (a merge)."""
        scope = plan.scope
        settings = scope.settings
        staged = self._staged()
        names = list(staged.schema.names)
        written, rows = staged.relation, staged.num_rows
        if settings.mode == "merge" and settings.dedupe_order_by:
            q = statements.dedupe(
                scope.staged.relation.strip('"'), scope.key, settings.dedupe_order_by, names
            )
            written = self.evaluator.create(q[0])
            rows = self.evaluator.one(f"SELECT count(*) FROM {written}")[0]
        on_stage("deleted")
        key = tuple(scope.key) if settings.mode == "merge" and not settings.delete_missing else ()
        change = self._change(plan, written, rows, key)
        self._pending = self._committer(scope, change, on_stage)
        return Written(rows=rows, fingerprints=self._fingerprints(scope, written, names))

    def _staged(self) -> StagedRows:
        if self._batch is None:
            raise RuntimeError("stage() must run before a write")
        return self._batch

    def _keys(self, scope: Scope) -> pa.Table:
        """The batch's key columns, as stored: what a merge looks its keys up by."""
        staged = self._staged()
        if not staged.streamed:
            return staged.whole().select(scope.key)
        cols = ", ".join(quote(k) for k in scope.key)
        keys = self.evaluator.arrow(f"SELECT DISTINCT {cols} FROM {staged.relation}")
        return keys.cast(pa.schema([staged.schema.field(k) for k in scope.key]))

    def _change(self, plan: WritePlan, written: str, rows: int, key: tuple[str, ...]) -> Change:
        """What the held-back commit writes: the batch over the window, owner and schema.

        A streamed batch is read when the commit writes its files, and the run log says how
        many of its ``rows`` Iceberg has taken.
        """
        scope, claim = plan.scope, plan.claim
        changes = scope.fitted.changes
        evolved_schema = None
        if changes and self._columns is not None:
            after = evolved(self._columns, changes)
            evolved_schema = pa.schema([pa.field(c, t) for c, t in after.items()])
        summary = {ASSET_SUMMARY: scope.settings.asset}
        if scope.window is not None:
            summary[PARTITIONS_SUMMARY] = scope.window.describe()
        types = {**(self._columns or {}), **scope.fitted.partition_types}
        staged = self._staged()
        if staged.streamed:
            # Read when the commit writes its files, a bounded table at a time.
            def chunks() -> Iterator[pa.Table]:
                found = Counted(staged.reader(written), plan.progress, CAPABILITIES.engine, rows)
                return _grouped(found.reader(), FILE_ROWS)

            batch, streamed = (self._keys(scope) if key else staged.schema.empty_table()), chunks
        else:
            batch, streamed = staged.reader(written).read_all(), None
        return Change(
            batch=batch,
            chunks=streamed,
            schema=staged.schema,
            scope=region_filter(scope.region, types),
            region=scope.region,
            key=key,
            properties={OWNER_PROPERTY: scope.settings.asset} if claim else {},
            evolved=evolved_schema,
            snapshot_properties=summary,
        )

    def _committer(
        self, scope: Scope, change: Change, on_stage: Callable[[str], None]
    ) -> Callable[[], IcebergTable]:
        """The commit of ``change``: on main, or through an audit branch."""
        backend, table, ident = self.backend, self._table, self._identifier
        assert ident is not None
        settings = scope.settings
        categories = [c for c in settings.partition_names if c != settings.time_column]

        def commit() -> IcebergTable:
            if backend.audit:
                from idem_assets.lib.backends.iceberg.audit_branch import publish_audited

                return publish_audited(
                    backend.catalog,
                    ident,
                    table,
                    change,
                    scope,
                    backend.audit,
                    settings.time_column,
                    categories,
                    on_stage,
                )
            if table is None:
                return create(backend.catalog, ident, change, settings.time_column, categories)
            tx = table.transaction()
            stage(tx, table, change)
            return tx.commit_transaction()

        return commit

    def _fingerprints(self, scope: Scope, written: str, columns: list[str]) -> Fingerprints:
        """Count and hash sum of the window as the held-back commit leaves it.

        Computed from the staged batch (and, for an upsert, the window's rows whose key the
        batch does not hold) with the row hash :meth:`IcebergBackend.fingerprint` applies to
        the stored rows.
        """
        ev = self.evaluator
        after = self._after(scope, written, columns)
        if scope.cells:
            q = statements.partition_fingerprints(after, columns, scope.cells)
            return {k: (n, d) for k, n, d in ev.rows(q)}
        count, digest = ev.one(statements.fingerprint(after, columns, scope.region))
        return {None: (count, digest)}

    def _after(self, scope: Scope, written: str, columns: list[str]) -> str:
        """A relation holding the window as the pending commit leaves it."""
        ev = self.evaluator
        cols = ", ".join(quote(c) for c in columns)
        relation = f"SELECT {cols} FROM {written}"
        settings = scope.settings
        if settings.mode == "merge" and scope.table_exists and not settings.delete_missing:
            on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in scope.key)
            stored = set(self._columns or {})
            kept = ", ".join(
                f"t.{quote(c)}" if c in stored else f"NULL AS {quote(c)}" for c in columns
            )
            relation += (
                f" UNION ALL SELECT {kept} FROM {quote(self._window(scope))} t"
                f" ANTI JOIN {written} s ON {on}"
            )
        if relation == f"SELECT {cols} FROM {written}":
            return written.strip('"')
        return ev.create(relation, _PREFIX).strip('"')
