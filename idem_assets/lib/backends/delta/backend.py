"""The Delta Lake backend: one Delta commit per publish, decided by the engine-neutral guards.

A Delta table has no multi-statement transaction: a write is one optimistic commit to its log.
So the publish reads one snapshot of the table, fits the batch to it on Arrow types (Delta's in
:mod:`.types`), the guards judge the staged batch against it in an embedded DuckDB (the batch and
the window read from Delta registered as Arrow), and the write itself is held back until the
transaction ends, where it becomes exactly one commit: a predicate overwrite of the window (per
box of its region: ``>= start AND < end`` per span and ``column IN (...)`` per category, typed
literals, :mod:`.layout`), or one ``DeltaTable.merge`` scoped the same way. A crash at any stage
before that commit leaves the table at its old version. A commit that loses to a concurrent
writer of the same files raises :class:`~idem_assets.lib.write.seam.CommitConflict`, and the
publish starts over on the new version.

The owning asset is the table's name in its Delta metadata (:data:`~.layout.OWNER_PREFIX` and
the asset key), set by the commit that creates the table and read with the snapshot before any
write; delta-rs names a table in no other commit that writes rows, so a table nobody owns is
handed over by its user first (the snapshot's handover code).
"""

import os
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

import duckdb
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, WriterProperties, write_deltalake
from deltalake.exceptions import DeltaError, TableNotFoundError
from deltalake.transaction import Transaction

from idem_assets.lib.backends.delta import staged_files
from idem_assets.lib.backends.delta.errors import denied, log_damage, lost_commit, refused_rows
from idem_assets.lib.backends.delta.handover import bounded
from idem_assets.lib.backends.delta.layout import (
    DAY_COLUMN,
    OWNER_PREFIX,
    delta_partitions,
    file_in_box,
    owner_of,
    predicate,
    quote_key,
    region_filter,
    table_uri,
    with_day,
)
from idem_assets.lib.backends.delta.types import DeltaTypes
from idem_assets.lib.model.errors import ConfigurationError
from idem_assets.lib.model.identifiers import quote
from idem_assets.lib.model.settings import WriteSettings
from idem_assets.lib.model.windows import Box, Region, WriteWindow, stored_region
from idem_assets.lib.sql import statements
from idem_assets.lib.sql.predicates import Statement
from idem_assets.lib.write.evaluator import (
    Counted,
    DuckDBEvaluator,
    StagedRows,
    embedded,
    embedded_database,
    reading,
    staged_rows,
)
from idem_assets.lib.write.seam import (
    Capabilities,
    CommitConflict,
    Counts,
    Fingerprints,
    Fitted,
    PartitionColumns,
    Progress,
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
from idem_assets.lib.write.streams import CHUNK_ROWS, SpillArea, Spilled, Stream, memory_lent

# delta-rs splits a partitioned write over one writer per CPU, each taking the rows whose
# partition values hash to it. A day's rows all hash to one, and DataFusion's repartition lets
# the reader run on while any other writer's queue is empty: every batch the busy writer had not
# encoded yet waited in memory, so a streamed day of 20M rows took 1.7 GB. With one writer its
# queue is bounded. delta-rs reads the setting once, at the first partitioned write of the
# process; one the user set is kept.
os.environ.setdefault("DELTARS_MAX_CONCURRENT_WRITERS", "1")

if TYPE_CHECKING:
    # Only the annotations name pandas: importing it costs a run worker about a second.
    import pandas as pd

_TARGET_PREFIX = "idem-target-"
#: What a streamed load reads of a file at a time: never a whole column chunk at once.
READ_BUFFER = 1 << 20
#: What DuckDB keeps of a streamed batch's staging limit while delta-rs writes the staged rows.
SCAN_MEMORY = "32MB"
#: What a commit writes: a table in memory, or the rows of a streamed batch read as they go.
Rows: TypeAlias = pa.Table | pa.RecordBatchReader
#: The application id of every merge's commit (a Delta ``txn`` action): see ``_merging``.
MERGE_APP_ID = "idem_assets:merge"
_PRUNABLE_KEY_TYPES = {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "VARCHAR", "DATE"}

CAPABILITIES = Capabilities(
    engine="Delta Lake",
    types=DeltaTypes(""),
    commit="optimistic",
    writes_in_commit=True,
    stages_files=True,
    # Staging floors timestamps to the stored microseconds in Arrow: a floor keeps every row
    # on its side of a window bound, so the guards judge exactly the rows Delta stores.
    timestamps="floor",
    # delta-rs cannot change a column's type in the commit that writes the batch.
    schema_changes=frozenset({"add_column"}),
    key_path=lambda column, value: f"{column}={quote_key(value)}",
)


@dataclass
class _Table:
    """The table as one publish read it: every read and the commit use this version."""

    uri: str
    table: DeltaTable | None
    #: Columns as stored, without :data:`DAY_COLUMN`.
    schema: pa.Schema | None
    #: The table's Delta partition columns (:data:`DAY_COLUMN` and category columns).
    partition_by: tuple[str, ...]

    @property
    def partitioned(self) -> bool:
        """Whether the table is partitioned by the derived day."""
        return DAY_COLUMN in self.partition_by


#: WriterProperties' whole-number fields, which the IO manager's config gives as text, each
#: with a value a refusal shows as an example.
_WRITER_NUMBERS = {
    "data_page_size_limit": 1_048_576,
    "dictionary_page_size_limit": 1_048_576,
    "data_page_row_count_limit": 20_000,
    "write_batch_size": 1024,
    "max_row_group_size": 131_072,
    "compression_level": 3,
    "statistics_truncate_length": 64,
}


def _writer_properties(options: Mapping[str, Any]) -> WriterProperties | None:
    """deltalake.WriterProperties of the IO manager's values, Snappy unless a codec is named.

    delta-rs compresses with Snappy only when given no properties at all: any one set without
    a codec wrote uncompressed files. A number given as text failed at the first write.
    """
    if not options:
        return None
    chosen = {"compression": "SNAPPY", **options}
    for name in _WRITER_NUMBERS.keys() & chosen.keys():
        try:
            chosen[name] = int(chosen[name])
        except (TypeError, ValueError):
            raise ConfigurationError(
                f"writer_properties {name!r} is {chosen[name]!r}, not a whole number. Nothing"
                f" was written. Fix: give a whole number, e.g. writer_properties={{{name!r}:"
                f" '{_WRITER_NUMBERS[name]}'}}."
            ) from None
    return WriterProperties(**chosen)


class DeltaBackend:
    """Publishes to Delta tables under ``root``; use it in a ``with`` (or :meth:`close` it)."""

    capabilities: ClassVar[Capabilities] = CAPABILITIES

    def __init__(
        self,
        root: str,
        storage_options: dict[str, str] | None = None,
        *,
        commit_metadata: Mapping[str, str] | None = None,
        writer_properties: Mapping[str, str] | None = None,
        table_config: Mapping[str, str] | None = None,
    ) -> None:
        """Tables live at ``<root>/<schema>/<table>``; ``storage_options`` reach object storage.

        ``commit_metadata`` goes into every commit's history entry, ``writer_properties`` make
        deltalake.WriterProperties for the files written, ``table_config`` the properties of a
        table this backend creates.
        """
        self.root = root
        self.storage_options = storage_options or None
        self.commit_metadata = dict(commit_metadata or {})
        self.writer_properties = _writer_properties(writer_properties or {})
        self.table_config = dict(table_config or {}) or None
        #: A local file system's limit on a file name; object stores take far longer keys.
        self.name_limit = 255 if "://" not in root or root.startswith("file://") else None

    def spill_area(self) -> SpillArea:
        """A streamed batch is staged in the embedded DuckDB, in a file once it is big.

        The commit scans the copy for delta-rs's writer (the copy itself where the stream has
        the types Delta stores): a compressed file is read back with less work than a table
        evicted to DuckDB's temporary files.
        """
        return SpillArea(embedded_database(), temporary=False, files=True)

    def stage_files(
        self, stream: Stream, settings: WriteSettings, memory: str, progress: Progress
    ) -> Spilled | None:
        """The stream written once as a data file of its table (:mod:`.staged_files`), if it can be.

        ``None`` (the stream unread) for a table to create, one on object storage or laid out
        otherwise, a batch to fit to it, or writer properties the IO manager set.
        """
        uri = self.uri(settings.schema, settings.table)
        folder = staged_files.local_folder(self.root, uri)
        if folder is None or self.writer_properties is not None or settings.time_column is None:
            return None
        table = self.open(uri)
        if table is None or not staged_files.fits(table, settings, stream.schema):
            return None
        return staged_files.stage_files(uri, folder, stream, settings.time_column, memory, progress)

    def writing(self) -> dict[str, Any]:
        """The writer properties a write or merge takes, when the IO manager set any."""
        return {"writer_properties": self.writer_properties} if self.writer_properties else {}

    def __enter__(self) -> "DeltaBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing is held between publishes: each opens and closes its own evaluator."""

    def uri(self, schema: str, table: str) -> str:
        """Where ``schema.table`` lives."""
        return table_uri(self.root, schema, table)

    def open(self, uri: str, where: str | None = None) -> DeltaTable | None:
        """The table's latest version, ``None`` without one; a log it cannot read is named."""
        try:
            return DeltaTable(uri, storage_options=self.storage_options)
        except TableNotFoundError:
            return None
        except DeltaError as exc:
            target = ".".join(uri.rsplit("/", 2)[-2:])
            damaged = log_damage(exc, where, uri, target)
            if damaged is None:
                raise
            raise damaged from exc

    @contextmanager
    def begin(self, where: str) -> Iterator["DeltaTransaction"]:
        """A fresh evaluator for the guards; the one Delta commit when the body returns."""
        tx = DeltaTransaction(self, where)
        failed = False
        try:
            yield tx
            tx.commit()
        except (DeltaError, OSError) as exc:
            failed = True
            lost = lost_commit(exc)
            if lost is not None:
                raise CommitConflict(lost) from exc
            explained = tx.explained(exc)
            if explained is None:
                raise
            raise explained from exc
        except BaseException:
            failed = True
            raise
        finally:
            tx.close(failed)

    def fingerprint(
        self, table: TableRef, partition_columns: PartitionColumns, window: WriteWindow | None
    ) -> tuple[int, int] | None:
        """Count and hash sum of a table (or one window of it); ``None`` when it is absent."""
        found = self.open(self.uri(table.schema, table.table))
        if found is None:
            return None
        full = pa.schema(found.schema().to_arrow())  # type: ignore[arg-type]
        columns = {f.name: f.type for f in full if f.name != DAY_COLUMN}
        region = stored_region(window, partition_columns, columns, table.name)
        with _reading() as ev:
            target = _register(ev, found, found.metadata().partition_columns, region)
            count, digest = ev.one(statements.fingerprint(target, list(columns), region))
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
        found = self.open(self.uri(settings.schema, settings.table))
        if found is None:
            return None
        full = pa.schema(found.schema().to_arrow())  # type: ignore[arg-type]
        stored = {f.name: f.type for f in full if f.name != DAY_COLUMN}
        name = f"{settings.schema}.{settings.table}"
        region = stored_region(
            None if nothing else window, settings.partition_columns, stored, name
        )
        by_lower = {c.lower(): c for c in stored}
        order = [by_lower.get(c.lower(), c) for c in settings.partition_names]
        names = selected_columns(columns, stored)

        selected = list(stored) if names is None else names

        def select(ev: DuckDBEvaluator) -> Statement:
            target = _register(ev, found, found.metadata().partition_columns, region)
            return statements.select_window(target, selected, region, order, nothing)

        def select_streamed(ev: DuckDBEvaluator) -> Statement:
            # The columns the statement names: those selected, and those it filters and sorts by.
            named = {*selected, *order, *(c.column for box in region for c in box)}
            rows = _window_files(
                found,
                found.metadata().partition_columns,
                region,
                [c for c in stored if c in named],
                nothing,
            )
            target = ev.register(rows, _TARGET_PREFIX).strip('"')
            return statements.select_window(target, selected, region, order, nothing)

        if stream:
            return reading(select_streamed)
        with _reading() as ev:
            q, p = select(ev)
            relation = ev.conn.sql(q, params=p)
            return relation.to_arrow_table() if arrow else relation.df()


@contextmanager
def _reading() -> Iterator[DuckDBEvaluator]:
    """An evaluator for one read, released and closed after."""
    ev = embedded()
    try:
        yield ev
    finally:
        ev.release()
        ev.conn.close()


def _register(
    ev: DuckDBEvaluator,
    table: DeltaTable,
    partition_by: Sequence[str],
    region: Region,
    pruning: list[list[tuple[str, str, Any]]] | None = None,
) -> str:
    """Register ``table`` (only the files the region's partitions can be in) for reads."""
    if region:
        pruning = region_filter(region, partition_by)
    dataset = table.to_pyarrow_dataset(file_pruning_predicate=pruning)  # type: ignore[arg-type]
    return ev.register(dataset, _TARGET_PREFIX).strip('"')


def _window_files(
    table: DeltaTable,
    partition_by: Sequence[str],
    region: Region,
    names: Sequence[str],
    nothing: bool = False,
) -> pa.RecordBatchReader:
    """Columns ``names`` of the files the region's partitions can be in, a bounded batch at a time.

    The rows are those of the table's Arrow dataset (its files, its schema, each file's
    partition values), but not read through its scanner: that decodes a whole row group before
    it hands out a batch of it, and DuckDB scans a registered dataset four files and sixteen
    batches ahead, so a 20M-row day (six files of 1M-row groups) took 1.6 GB only to be
    scanned. One file at a time, a batch at a time through a small buffer, Arrow holds about
    40 MB whatever the window's size. Every row of those files comes back (no file statistics
    prune them): the window's predicate is the caller's. ``nothing``: no file is read.
    """
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    pruning = region_filter(region, partition_by) if region else None
    dataset = table.to_pyarrow_dataset(file_pruning_predicate=pruning)  # type: ignore[arg-type]
    schema = pa.schema([dataset.schema.field(n) for n in names])

    def batches() -> Iterator[pa.RecordBatch]:
        for fragment in [] if nothing else dataset.get_fragments():
            values = pads.get_partition_keys(fragment.partition_expression)
            with fragment.open() as source:  # type: ignore[attr-defined]
                file = pq.ParquetFile(source, pre_buffer=False, buffer_size=READ_BUFFER)
                held = [n for n in names if n in file.schema_arrow.names]
                for batch in file.iter_batches(CHUNK_ROWS, columns=held):
                    yield _in_schema(batch, schema, values)

    return pa.RecordBatchReader.from_batches(schema, batches())


def _in_schema(
    batch: pa.RecordBatch, schema: pa.Schema, values: Mapping[str, Any]
) -> pa.RecordBatch:
    """A file's batch in the table's schema, as its dataset reads it.

    A column the file lacks is its partition value there (a Delta file holds none of them),
    else null (a column added after the file was written).
    """
    columns = []
    for field in schema:
        if field.name in batch.schema.names:
            columns.append(batch.column(field.name).cast(field.type))
        else:
            value = pa.scalar(values.get(field.name), field.type)
            columns.append(pa.repeat(value, batch.num_rows))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


class DeltaTransaction:
    """One publish: reads one version, and holds its write back as the commit at the end."""

    def __init__(self, backend: DeltaBackend, where: str) -> None:
        """Publish through ``backend`` (its root and storage options)."""
        self.backend = backend
        self.where = where
        self.evaluator = embedded()
        self.committed: dict[str, Any] = {}
        self._table: _Table | None = None
        self._views: list[str] = []
        self._pending: Callable[[], int] | None = None
        self._batch: StagedRows | None = None
        self._spilled: Spilled | None = None

    def close(self, failed: bool) -> None:
        """Drop what this publish registered in the embedded DuckDB, and close its cursor."""
        try:
            for view in self._views:
                try:
                    self.evaluator.conn.execute(f"DROP VIEW IF EXISTS {view}").fetchall()
                except duckdb.Error:
                    # A commit that failed midway may leave a result open on the cursor: its
                    # error is the one to report, and its temporary views go when it closes.
                    if not failed:
                        raise
            self.evaluator.release(failed)
        finally:
            self.evaluator.conn.close()

    def commit(self) -> None:
        """The held-back write, as one Delta commit; its version goes to the metadata."""
        if self._pending is None:
            return
        version = self._pending()
        current = self._current()
        self.committed = {"delta_version": version, "delta_table_uri": current.uri}

    def explained(self, exc: BaseException) -> Exception | None:
        """A library error naming what delta-rs failed on and its fix, if it is one it knows."""
        snap, root = self._table, self.backend.root
        if snap is None or snap.table is None:
            return denied(exc, self.where, root)
        target = snap.uri.rsplit("/", 2)
        table = snap.table
        checks = {
            name.removeprefix("delta.constraints."): expression
            for name, expression in table.metadata().configuration.items()
            if name.startswith("delta.constraints.") and expression is not None
        }
        fields = pa.schema(table.schema().to_arrow())  # type: ignore[arg-type]
        not_null = [f.name for f in fields if not f.nullable]
        return (
            refused_rows(exc, self.where, snap.uri, checks, not_null)
            or log_damage(exc, self.where, snap.uri, f"{target[-2]}.{target[-1]}")
            or denied(exc, self.where, root)
        )

    def _current(self) -> _Table:
        if self._table is None:
            raise RuntimeError("describe() opens the table's version before anything reads it")
        return self._table

    def describe(self, settings: WriteSettings) -> Snapshot:
        """Open the table's latest version: every later read and the commit use it."""
        backend = self.backend
        uri = backend.uri(settings.schema, settings.table)
        table = backend.open(uri, self.where)
        schema, owner, partition_by, append_only = None, None, (), False
        if table is not None:
            full = pa.schema(table.schema().to_arrow())  # type: ignore[arg-type]
            partition_by = tuple(table.metadata().partition_columns)
            schema = pa.schema([f for f in full if f.name != DAY_COLUMN])
            owner = owner_of(table)
            config = table.metadata().configuration
            append_only = config.get("delta.appendOnly", "false").lower() == "true"
        self._table = _Table(uri, table, schema, partition_by)
        columns = None
        if schema is not None:
            types = DeltaTypes(uri)
            columns = {f.name: StoredColumn(f.type, types.type_sql(f.type)) for f in schema}
        name = OWNER_PREFIX + "{asset}"
        # Only the commit that creates a table can name its owner with its rows (delta-rs
        # commits no name with a write): a table nobody owns is handed over first.
        return Snapshot(
            table=TableRef.of(settings),
            columns=columns,
            owner=owner,
            claimable=table is None,
            handover=f"deltalake.DeltaTable({uri!r}).alter.set_table_name('{name}')",
            append_only=append_only,
            lift_append_only=(
                f"deltalake.DeltaTable({uri!r}).alter.set_table_properties("
                "{'delta.appendOnly': 'false'})"
            ),
            append_only_property="delta.appendOnly",
            path_limit=backend.name_limit,
            layout=partition_by,
            types_dialect=DeltaTypes(uri),
        )

    def stage(self, batch: pa.Table | Spilled, fitted: Fitted) -> Staged:
        """The batch cast to the stored names and types in Arrow, registered for the guards."""
        self._batch = staged_rows(self.evaluator, batch, fitted)
        self._spilled = batch if isinstance(batch, Spilled) else None
        return Staged(relation=self._batch.relation, evaluator=self.evaluator)

    def _target(self, scope: Scope, whole: bool = False) -> str:
        snap = self._current()
        assert snap.table is not None
        region = () if whole else scope.region
        return _register(self.evaluator, snap.table, snap.partition_by, region)

    def _files(self) -> pa.Table:
        """The snapshot's data files with their row counts and column statistics."""
        snap = self._current()
        assert snap.table is not None
        return pa.table(snap.table.get_add_actions(flatten=True))  # type: ignore[arg-type]

    def _counted_from_statistics(self, scope: Scope) -> Counts | None:
        """The window's row counts from the files' statistics, or ``None`` if a scan must tell.

        A file whose rows all lie inside one partition of the window counts whole, one whose
        rows all lie outside it counts nothing; any other file needs its rows read.
        """
        files = self._files()
        if not scope.region or "num_records" not in files.column_names:
            return None
        parts: list[tuple[str | None, Box]] = list(scope.cells) or [
            (None, box) for box in scope.region
        ]
        wanted = {f"{kind}.{c}" for c in scope.pcols for kind in ("min", "max", "partition")}
        stats = {n: files.column(n).to_pylist() for n in files.column_names if n in wanted}
        counts: Counts = {}
        for i, n in enumerate(files.column("num_records").to_pylist()):
            if n is None:
                return None
            placed = [(k, file_in_box(stats, i, box)) for k, box in parts]
            inside = [k for k, verdict in placed if verdict is True]
            if inside:
                counts[inside[0]] = counts.get(inside[0], 0) + n
            elif any(verdict is None for _, verdict in placed):
                return None
        if not scope.cells:
            return {None: counts.get(None, 0)}
        return counts

    def _key_pruning(self, scope: Scope) -> list[list[tuple[str, str, Any]]] | None:
        """Files whose key statistics may hold a key of the batch: the batch's key ranges."""
        ev, source = self.evaluator, scope.staged.relation
        types = {r[0]: r[1] for r in ev.rows(f"DESCRIBE SELECT * FROM {source}")}
        # Integers, text and dates compare in file statistics exactly as in the batch.
        usable = [k for k in scope.key if types.get(k) in _PRUNABLE_KEY_TYPES]
        if not usable:
            return None
        ranges = ", ".join(f"min({quote(k)}), max({quote(k)})" for k in usable)
        found = ev.one(f"SELECT {ranges} FROM {source}")
        if any(v is None for v in found):
            return None
        conjunction: list[tuple[str, str, Any]] = []
        for i, k in enumerate(usable):
            conjunction += [(k, ">=", found[2 * i]), (k, "<=", found[2 * i + 1])]
        return [conjunction]

    def _counted(self, scope: Scope) -> Counts:
        """Rows of each partition of the window in the snapshot, counted by a scan."""
        target = self._target(scope)
        if scope.cells:
            return dict(self.evaluator.rows(statements.count_by_partition(target, scope.cells)))
        return {None: self.evaluator.one(statements.count_window(target, scope.region))[0]}

    def summarize(self, scope: Scope, final: bool = False) -> Summary:
        """Rows the window holds in the snapshot, and for a merge its keys' rows."""
        if not scope.table_exists:
            return Summary()
        ev = self.evaluator
        counted = self._counted_from_statistics(scope)
        existing = self._counted(scope) if counted is None else counted
        if scope.settings.mode != "merge":
            return Summary(existing=existing)
        snap = self._current()
        assert snap.table is not None
        target = _register(ev, snap.table, snap.partition_by, (), self._key_pruning(scope))
        source, key = scope.staged.relation.strip('"'), scope.key
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
            whole = self._target(scope, whole=True)
            found = ev.arrow(
                statements.keys_outside_window_sample(whole, source, key, scope.region)
            )
            sample = found.drop_columns([c for c in found.column_names if c == DAY_COLUMN])
        return Summary(existing, matched, elsewhere, sample)

    def _stored(
        self, written: str, plan: WritePlan, total: int | None = None
    ) -> Callable[[], Rows]:
        """The rows of ``written`` laid out as the table is (its :data:`DAY_COLUMN`).

        A table in memory, or for a streamed batch a reader made anew for each read, which
        says in the run log how many of the ``total`` rows delta-rs has taken.
        """
        settings = plan.scope.settings
        snap = self._current()
        # A table another tool made keeps its own layout: its files are never given the day.
        day_from = settings.time_column if snap.table is None or snap.partitioned else None
        staged = self._staged()
        if not staged.streamed:
            table = with_day(staged.reader(written).read_all(), day_from)
            return lambda: table

        def stream() -> pa.RecordBatchReader:
            counted = Counted(staged.reader(written), plan.progress, CAPABILITIES.engine, total)
            found = counted.reader()
            schema = with_day(found.schema.empty_table(), day_from).schema
            laid_out = (
                b
                for part in found
                for b in with_day(pa.Table.from_batches([part]), day_from).to_batches()
            )
            return pa.RecordBatchReader.from_batches(schema, laid_out)

        return stream

    def _scanning(self) -> AbstractContextManager[None]:
        """While the commit writes a streamed batch: the staging limit lent to delta-rs's writer.

        DuckDB only scans the staged rows then; what it held of them would sit beside the
        writer's own buffers (a row group in progress, the file being sent) for nothing.
        """
        spilled = self._spilled
        if spilled is None:
            return nullcontext()
        # delta-rs frees the batches DuckDB hands it on its own threads. Without its background
        # thread DuckDB's allocator kept that memory while a data file was written, and gave it
        # back only between files: a 20M-row day peaked at 1.1 GB, with the thread at 0.9 GB.
        # The setting is the process's, as DuckDB's allocator is.
        with spilled.area.cursor() as cursor:
            cursor.execute("SET allocator_background_threads = true").fetchall()
        return memory_lent(spilled.area.conn, spilled.memory, SCAN_MEMORY)

    def _staged(self) -> StagedRows:
        if self._batch is None:
            raise RuntimeError("stage() must run before a write")
        return self._batch

    def _predicate(self, scope: Scope, alias: str | None = None) -> str | None:
        """The window as a Delta predicate, ``None`` without one (the whole table)."""
        if not scope.region:
            return None
        partitioned = self._current().partitioned or self._current().table is None
        return predicate(scope.region, scope.fitted.partition_types, alias, partitioned)

    def write(self, plan: WritePlan, on_stage: Callable[[str], None]) -> Written:
        """Hold back one commit: a predicate overwrite of the window, or one scoped merge."""
        scope = plan.scope
        settings = scope.settings
        staged = self._staged()
        names = list(staged.schema.names)
        adds = any(c.action == "add_column" for c in scope.fitted.changes)
        written, rows = staged.relation, staged.num_rows
        if settings.mode == "merge" and settings.dedupe_order_by:
            q = statements.dedupe(
                scope.staged.relation.strip('"'), scope.key, settings.dedupe_order_by, names
            )
            written = self.evaluator.view(q)
            rows = self.evaluator.one(f"SELECT count(*) FROM {written}")[0]
        on_stage("deleted")
        snap = self._current()
        files = self._files_to_add(scope, written, adds)
        if files is not None:
            after = self._after(scope, written, names)
            self._pending = self._add(files)
        elif settings.mode == "overwrite" or snap.table is None:
            after = self._after(scope, written, names)
            self._pending = self._overwrite(scope, self._stored(written, plan, rows), adds)
        elif adds or self._rewrites(scope):
            # The window as the merge leaves it is written instead, as the window's overwrite
            # (one commit): delta-rs's schema-merging MERGE commits the table's metadata without
            # its name, which records the owner, and its MERGE holds the whole batch in memory
            # (its hash join cannot spill), where DuckDB computes the window under the staging
            # limit and the overwrite writes it a batch at a time.
            after = self._merged(scope, written, names)
            self._pending = self._overwrite(scope, self._stored(after, plan), adds)
        else:
            after = self._after(scope, written, names)
            self._pending = self._merge(scope, self._stored(written, plan, rows))
        return Written(rows=rows, fingerprints=self._fingerprints(scope, after, names))

    def _files_to_add(
        self, scope: Scope, written: str, adds: bool
    ) -> tuple[staged_files.StagedFiles, list[date]] | None:
        """The staged file and the window's days, when the commit can add the file as it is.

        The file must hold the rows exactly as written (nothing fitted, deduplicated or added)
        for one day of a window of whole days, into the table as the publish read it.
        """
        files, snap = self._spilled, self._current()
        if not isinstance(files, staged_files.StagedFiles) or files.day is None or adds:
            return None
        if snap.table is None or snap.uri != files.uri or written != files.relation:
            return None
        if not staged_files.fits(snap.table, scope.settings, files.schema):
            return None
        days = staged_files.whole_days(scope.region, scope.settings.time_column)
        if days is None or files.day not in days:
            return None
        return files, days

    def _add(self, found: tuple[staged_files.StagedFiles, list[date]]) -> Callable[[], int]:
        """The commit that adds the staged file in place of the window's days."""
        snap = self._current()
        assert snap.table is not None
        table, folder = snap.table, staged_files.local_folder(self.backend.root, snap.uri)
        assert folder is not None
        files, days = found
        return lambda: staged_files.add(table, files, folder, days, self._commit_properties)

    def _rewrites(self, scope: Scope) -> bool:
        """Whether a merge of a streamed batch is written as the window's overwrite.

        Not on an append-only table: its merges may only add rows, and an overwrite removes
        the window's files.
        """
        return self._spilled is not None and not scope.snapshot.append_only

    def _merged(self, scope: Scope, written: str, columns: list[str]) -> str:
        """The window as the merge leaves it: the batch, and for an upsert the rows it keeps.

        Those go into a table of the embedded DuckDB (spilled past the staging limit), the
        window's rows read from its files one batch at a time.
        """
        if scope.settings.delete_missing:
            return written
        snap = self._current()
        assert snap.table is not None and snap.schema is not None
        names = snap.schema.names
        files = _window_files(snap.table, snap.partition_by, scope.region, names)
        target = self.evaluator.register(files, _TARGET_PREFIX).strip('"')
        window = statements.select_window(target, names, scope.region)
        merged = self._after_query(scope, written, columns, f"({window.sql})")
        return self.evaluator.create(Statement(merged, window.params))

    def _overwrite(self, scope: Scope, data: Callable[[], Rows], adds: bool) -> Callable[[], int]:
        """The commit that replaces the window with ``data`` (or creates the table with it)."""
        snap = self._current()
        where = self._predicate(scope)

        def commit() -> int:
            with self._scanning():
                rows = data()
                if isinstance(rows, pa.RecordBatchReader):
                    rows = bounded(rows)
                if snap.table is None:
                    return self._create(scope, snap, rows)
                write_deltalake(
                    snap.table,
                    rows,
                    mode="overwrite",
                    predicate=where,
                    schema_mode="merge" if adds else None,
                    commit_properties=self._commit_properties(**self._merging(scope)),
                    **self.backend.writing(),
                )
            return snap.table.version()

        return commit

    def _merge(self, scope: Scope, data: Callable[[], Rows]) -> Callable[[], int]:
        """The commit of one ``DeltaTable.merge``: update matched, insert new, delete stale."""
        settings, snap = scope.settings, self._current()
        table = snap.table
        assert table is not None
        window = self._predicate(scope, "t")
        on = " AND ".join(f't."{k}" = s."{k}"' for k in scope.key)
        if window:
            # Scoped to the window: Delta reads and rewrites only its days' files.
            on += f" AND {window}"

        def commit() -> int:
            merger = (
                table.merge(
                    data(),
                    on,
                    source_alias="s",
                    target_alias="t",
                    commit_properties=self._commit_properties(**self._merging(scope)),
                    **self.backend.writing(),
                )
                .when_matched_update_all()
                .when_not_matched_insert_all()
            )
            if settings.delete_missing:
                merger = merger.when_not_matched_by_source_delete(window)
            merger.execute()
            return table.version()

        return commit

    def _create(self, scope: Scope, snap: _Table, data: Rows) -> int:
        """Create the table holding the batch, named after its owner: one commit, version 0.

        The publish decided on no table, so only version 0 may hold its batch. ``mode='error'``
        refuses a table another writer created before this one opened it; without a retry,
        delta-rs cannot rebase the creation onto a table created while this one wrote (it would
        commit version 1, the batch beside the other's). Either way the publish starts over on
        that writer's table and decides again.
        """
        write_deltalake(
            snap.uri,
            data,
            mode="error",
            partition_by=delta_partitions(scope.settings, data.schema) or None,
            name=OWNER_PREFIX + scope.settings.asset,
            configuration=self.backend.table_config,
            storage_options=self.backend.storage_options,
            commit_properties=self._commit_properties(max_commit_retries=0),
            **self.backend.writing(),
        )
        return 0

    def _merging(self, scope: Scope) -> dict[str, Any]:
        """For a merge's commit, the application transaction every merge of the table records.

        Two commits recording one application id conflict, whichever files they touch. A merge
        written as the window's overwrite reads only its window, and delta-rs let it commit
        beside a merge of another day that stored one of its keys meanwhile (so did a MERGE
        that keeps the window's other rows, scoped to the window): the key then lived in both
        days. Recorded by every merge, the later of two such commits starts over, and its
        guards see the key the other stored.
        """
        table = self._current().table
        if scope.settings.mode != "merge" or table is None:
            return {}
        return {"app_transactions": [Transaction(MERGE_APP_ID, table.version() + 1)]}

    def _commit_properties(self, **options: Any) -> CommitProperties | None:
        """The commit's properties: the IO manager's custom metadata and ``options``."""
        custom = self.backend.commit_metadata or None
        if custom is None and not options:
            return None
        return CommitProperties(custom_metadata=custom, **options)

    def _after(self, scope: Scope, written: str, columns: list[str]) -> str:
        """A relation holding the window as the pending commit leaves it (without the day)."""
        relation = self._after_query(scope, written, columns)
        name = quote(_TARGET_PREFIX + uuid.uuid4().hex)
        self.evaluator.conn.execute(f"CREATE TEMP VIEW {name} AS {relation}")
        self._views.append(name)
        return name

    def _after_query(
        self, scope: Scope, written: str, columns: list[str], window: str | None = None
    ) -> str:
        """The query of the window as the pending commit leaves it.

        ``window``: a relation of the window's stored rows, if not the snapshot's files.
        """
        cols = ", ".join(quote(c) for c in columns)
        relation = f"SELECT {cols} FROM {written}"
        settings = scope.settings
        if settings.mode == "merge" and scope.table_exists and not settings.delete_missing:
            # An upsert keeps the window's rows whose key the batch does not hold.
            on = " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in scope.key)
            # A column this publish adds holds NULL in the rows it keeps.
            before = self._current().schema
            stored = set(before.names) if before is not None else set()
            kept = ", ".join(
                f"t.{quote(c)}" if c in stored else f"NULL AS {quote(c)}" for c in columns
            )
            stored_rows = window or quote(self._target(scope))
            relation += (
                f" UNION ALL SELECT {kept} FROM {stored_rows} t ANTI JOIN {written} s ON {on}"
            )
        return relation

    def _fingerprints(self, scope: Scope, after: str, columns: list[str]) -> Fingerprints:
        """Count and hash sum of the window as the held-back commit leaves it.

        Computed from the staged batch (and, for a merge, the snapshot's window rows the batch
        keeps), with the row hash :meth:`DeltaBackend.fingerprint` applies to the stored rows:
        a function of the rows alone, whatever files hold them.
        """
        ev = self.evaluator
        relation = after.strip('"')
        if scope.cells:
            q = statements.partition_fingerprints(relation, columns, scope.cells)
            return {k: (n, d) for k, n, d in ev.rows(q)}
        count, digest = ev.one(statements.fingerprint(relation, columns, scope.region))
        return {None: (count, digest)}
