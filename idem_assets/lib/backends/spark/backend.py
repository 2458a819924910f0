"""The Spark backend: Parquet tables in Spark's catalog, each window swapped in by one call.

A publish stages the batch once, as Parquet in a fresh version directory under the table
(``<root>/_idem_versions/<uuid>``), and every guard reads that copy as Spark SQL jobs (the
batch never reaches the driver, and a DataFrame evaluated twice cannot differ between the
guards and the write). The write leaves that directory as it is (an overwrite of whole
partitions) or writes the window as it will be into another one (a merge, or a window that
covers part of a partition, whose other rows it keeps). Nothing a reader sees changes until
the commit: the window's partitions are pointed at their new directories by one metastore call
(:func:`~.catalog.move_partitions`), after empty placeholders for partitions the table lacks.
Spark's own overwrite modes are never used, so the session's ``partitionOverwriteMode`` plays
no part. The replaced directories are deleted after the commit.

Concurrent writers: each commit raises the table's ``idem.version`` property; a publish that
finds it raised since it described the table raises
:class:`~idem_assets.lib.write.seam.CommitConflict` and starts over on the new state.
"""

import json
import operator
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import pyarrow as pa
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from idem_assets.lib.backends.spark import catalog, sql
from idem_assets.lib.backends.spark.catalog import Spec
from idem_assets.lib.backends.spark.evaluator import SparkEvaluator
from idem_assets.lib.backends.spark.frames import (
    SparkFrame,
    day_of,
    fingerprint,
    fingerprint_metrics,
    numbered,
    observed,
    spark_batch,
)
from idem_assets.lib.backends.spark.layout import (
    COLUMNS,
    OWNER,
    ROOT,
    VERSION,
    VERSIONS,
    covers,
    directory,
    key_path,
    logical_columns,
    meets,
    new_layout,
)
from idem_assets.lib.backends.spark.locks import table_lock
from idem_assets.lib.backends.spark.sql import DAY, with_days
from idem_assets.lib.backends.spark.types import SparkTypes, arrow_type, spark_schema, spark_type
from idem_assets.lib.model.identifiers import validate_identifier
from idem_assets.lib.model.settings import WriteSettings
from idem_assets.lib.model.windows import Region, WriteWindow, stored_region
from idem_assets.lib.sql import statements
from idem_assets.lib.write.evaluator import DuckDBEvaluator, embedded, stored_rows
from idem_assets.lib.write.seam import (
    BatchProfile,
    Capabilities,
    CommitConflict,
    Counts,
    EngineBatch,
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
from idem_assets.lib.write.streams import CHUNK_ROWS, Spilled, spill_root

CAPABILITIES = Capabilities(
    engine="Spark",
    plan_predicts_fingerprints=False,
    types=SparkTypes(),
    commit="optimistic",
    # Staging floors timestamps to Spark's microseconds in Arrow (or Spark's own cast): a
    # floor keeps every row on its side of a window bound.
    timestamps="floor",
    # A Parquet table in Spark's catalog gains columns; it never changes a column's type.
    schema_changes=frozenset({"add_column"}),
    key_path=key_path,
)


@dataclass
class _Table:
    """A table as one publish read it from the catalog."""

    db: str
    name: str
    #: Where the table's version directories go (the table's own directory).
    root: str
    exists: bool = False
    #: The catalog's partition columns (:data:`DAY` and category columns).
    layout: tuple[str, ...] = ()
    #: Columns in the asset's order, without :data:`DAY`.
    columns: dict[str, StoredColumn] = field(default_factory=dict)
    struct: T.StructType | None = None
    properties: dict[str, str] = field(default_factory=dict)
    location: str = ""

    @property
    def qualified(self) -> str:
        """```db`.`table``` for statements."""
        return f"`{self.db}`.`{self.name}`"

    @property
    def version(self) -> int:
        """The commit counter the table holds."""
        return int(self.properties.get(VERSION, "0"))


@dataclass
class _Plan:
    """What the commit makes visible: a version directory and the partitions pointed into it."""

    version: str
    create: bool
    #: Every window partition's spec and its new directory.
    moves: dict[Spec, str]
    #: Partitions the table lacks, registered on an empty placeholder first.
    missing: list[Spec]
    added: list[tuple[str, str]]
    order: list[str]
    struct: T.StructType
    #: Directories the commit replaces, deleted after it.
    replaced: list[str]


class SparkBackend:
    """Publishes to Parquet tables in the catalog of ``spark``'s session."""

    capabilities: ClassVar[Capabilities] = CAPABILITIES

    def __init__(self, spark: SparkSession, warehouse: str | None = None) -> None:
        """Tables of a schema the catalog lacks go to ``<warehouse>/<schema>.db``.

        ``warehouse`` unset: the session's ``spark.sql.warehouse.dir``.
        """
        self.spark = spark
        self.warehouse = warehouse

    def __enter__(self) -> "SparkBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        """The session is the process's: it outlives the backend."""

    @contextmanager
    def begin(self, where: str) -> Iterator["SparkTransaction"]:
        """One publish: staged and decided first, made visible by the commit at the end."""
        tx = SparkTransaction(self, where)
        try:
            yield tx
            tx.commit()
        except BaseException as exc:
            tx.abort(exc)
            raise
        finally:
            tx.close()

    def evaluate(self, frame: DataFrame, settings: WriteSettings) -> EngineBatch:
        """``frame`` evaluated once, into a version directory of its table laid out as the table.

        Laid out by the table's partition columns (a new table's, for one that does not exist
        yet), the evaluated copy becomes the staged batch and the written partitions as it is
        when the batch fits the table unchanged (:meth:`SparkTransaction.stage`).
        """
        table = self.table(settings.schema, settings.table)
        names = {f.name.lower(): f for f in frame.schema}
        time = settings.time_column if settings.partition_columns else None
        sent_time = names.get(time.lower()) if time else None
        timestamp = sent_time is not None and isinstance(
            sent_time.dataType, T.TimestampType | T.TimestampNTZType
        )
        wanted = (
            table.layout
            if table.exists
            else new_layout(time, timestamp, list(settings.partition_names))
        )
        columns = [DAY if c == DAY else getattr(names.get(c.lower()), "name", "") for c in wanted]
        # A partition column the batch lacks, or a day of a column of no timestamp: the copy
        # is unpartitioned, and staging writes the batch again, laid out.
        usable = all(columns) and (DAY not in wanted or timestamp)
        layout = tuple(columns) if usable else ()
        location = f"{table.root}/{VERSIONS}/{uuid.uuid4().hex}"
        time_name = sent_time.name if sent_time is not None else None
        groups = [settings.partition_names, tuple(settings.primary_key)]
        sent = [tuple(names[c.lower()].name for c in g) for g in groups if _all_in(g, names)]
        return spark_batch(frame, settings.asset, location, layout, time_name, sent)

    def table(self, schema: str, table: str) -> _Table:
        """The table as the catalog holds it now (``exists`` False when it has none)."""
        db, name = validate_identifier(schema, "schema"), validate_identifier(table, "table")
        spark = self.spark
        info = catalog.table_info(spark, db, name)
        if info is None:
            return _Table(db, name, root=self._new_root(db, name))
        location, layout, properties, struct = info
        found = _Table(db, name, root=properties.get(ROOT, location), exists=True)
        found.properties, found.layout, found.location = properties, layout, location
        found.struct = struct
        by_name = {f.name: f for f in struct}
        found.columns = {
            n: StoredColumn(arrow_type(by_name[n].dataType), by_name[n].dataType.simpleString())
            for n in logical_columns(found.properties, by_name)
        }
        return found

    def _new_root(self, db: str, name: str) -> str:
        spark = self.spark
        if spark.catalog.databaseExists(db):
            base = spark.catalog.getDatabase(db).locationUri
        else:
            base = self._database_location(db)
        return catalog.qualified(spark, f"{base.rstrip('/')}/{name}")

    def _database_location(self, db: str) -> str:
        warehouse = self.warehouse or self.spark.conf.get("spark.sql.warehouse.dir")
        assert warehouse, "a session always names its warehouse"
        return f"{warehouse.rstrip('/')}/{db}.db"

    def create_database(self, db: str) -> None:
        """Create schema ``db`` where new schemas go, if the catalog lacks it."""
        if not self.spark.catalog.databaseExists(db):
            location = _literal(catalog.qualified(self.spark, self._database_location(db)))
            self.spark.sql(f"CREATE DATABASE IF NOT EXISTS `{db}` LOCATION {location}")

    def window(
        self, table: _Table, region: Region, names: Sequence[str] | None = None
    ) -> DataFrame:
        """The table's rows in ``region`` (pruned to its partitions), its columns in order."""
        names = list(table.columns) if names is None else list(names)
        pruned = with_days(region, _time_column(table, region)) if DAY in table.layout else region
        ev = SparkEvaluator(self.spark)
        return ev.frame(sql.select((table.db, table.name), names, pruned))

    def fingerprint(
        self, table: TableRef, partition_columns: PartitionColumns, window: WriteWindow | None
    ) -> tuple[int, int] | None:
        """Count and hash sum of a table (or one window of it); ``None`` when it is absent."""
        found = self.table(table.schema, table.table)
        if not found.exists:
            return None
        types = {n: c.type for n, c in found.columns.items() if c.type is not None}
        region = stored_region(window, partition_columns, types, table.name)
        ev = SparkEvaluator(self.spark)
        try:
            view = ev.register(self.window(found, region), "idem_target_")
            count, digest = ev.one(sql.fingerprint(view, list(found.columns), ()))
        finally:
            ev.release()
        return int(count), int(digest)

    def frame(
        self,
        settings: WriteSettings,
        window: WriteWindow | None,
        nothing: bool = False,
        columns: Sequence[str] | None = None,
    ) -> DataFrame | None:
        """The window's rows as a lazy DataFrame read with partition pruning; ``None``: no table.

        ``columns``: only those the table has (:func:`selected_columns`); Spark reads no other.
        """
        found = self.table(settings.schema, settings.table)
        if not found.exists:
            return None
        types = {n: c.type for n, c in found.columns.items() if c.type is not None}
        region = stored_region(
            None if nothing else window, settings.partition_columns, types, settings.asset
        )
        frame = self.window(found, region)
        names = selected_columns(columns, frame.columns)
        if names is not None:
            frame = frame.select(*[F.col(f"`{c}`") for c in names])
        return frame.limit(0) if nothing else frame

    def load(
        self,
        settings: WriteSettings,
        window: WriteWindow | None,
        nothing: bool = False,
        arrow: bool = True,
        columns: Sequence[str] | None = None,
        stream: bool = False,
    ) -> pa.Table | pd.DataFrame | pa.RecordBatchReader | None:
        """The window's rows (the whole table without one), in partition order."""
        frame = self.frame(settings, window, nothing)
        if frame is None:
            return None
        by_lower = {c.lower(): c for c in frame.columns}
        order = [by_lower[c.lower()] for c in settings.partition_names if c.lower() in by_lower]
        if order:
            frame = frame.orderBy(*[F.col(f"`{c}`") for c in order])
        # Sorted first, then projected: the order may use a column the selection leaves out.
        names = selected_columns(columns, frame.columns)
        if names is not None:
            frame = frame.select(*[F.col(f"`{c}`") for c in names])
        if stream:
            return _exported(frame)
        return frame.toArrow() if arrow else frame.toPandas()


def _exported(frame: DataFrame) -> pa.RecordBatchReader:
    """A sorted frame written by Spark as Parquet on this machine, read back file by file.

    Spark's executors write the files (in local mode they share the driver's disk); the parts
    of a sorted frame hold consecutive ranges, so reading them in order keeps its order.
    """
    import pyarrow.dataset as ds

    folder = Path(tempfile.mkdtemp(prefix="idem-spark-load-", dir=spill_root()))
    frame.write.mode("overwrite").parquet(str(folder / "rows"))
    parts = sorted(str(p) for p in (folder / "rows").glob("part-*.parquet"))
    schema = pa.schema([pa.field(f.name, arrow_type(f.dataType)) for f in frame.schema])
    if not parts:
        shutil.rmtree(folder, ignore_errors=True)
        return pa.RecordBatchReader.from_batches(schema, iter(()))
    found = ds.dataset(parts, format="parquet")

    def batches() -> Iterator[pa.RecordBatch]:
        try:
            for batch in found.to_batches(batch_size=CHUNK_ROWS):
                yield (
                    pa.Table.from_batches([batch]).select(schema.names).cast(schema).to_batches()[0]
                )
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    return pa.RecordBatchReader.from_batches(schema, batches())


def _all_in(columns: Sequence[str], names: Mapping[str, Any]) -> bool:
    """Whether ``columns`` are some columns, each of them one of ``names`` (lower-cased)."""
    return bool(columns) and all(c.lower() in names for c in columns)


def _time_column(table: _Table, region: Region) -> str | None:
    """The column of the region's time spans (the one :data:`DAY` is derived from)."""
    for box in region:
        for cond in box:
            if cond.spans:
                return cond.column
    return None


def _unchanged(batch: SparkFrame, fitted: Fitted, layout: tuple[str, ...]) -> bool:
    """Whether the evaluated copy is the batch as stored: same names, types and layout."""
    sent = {f.name: f.dataType for f in batch.schema}
    if batch.layout != layout or set(sent) != set(fitted.order):
        return False
    return all(
        f.name == f.stored_name and sent.get(f.name) == spark_type(f.stored_type)
        for f in fitted.columns
    )


def _stored_layout(
    table: _Table, settings: WriteSettings, types: Mapping[str, pa.DataType]
) -> tuple[str, ...]:
    """The partition columns the batch is stored by: the table's, or a new table's."""
    if table.exists:
        return table.layout
    time_column = settings.time_column if settings.partition_columns else None
    kind = types.get(time_column) if time_column else None
    timestamp = kind is not None and pa.types.is_timestamp(kind)
    return new_layout(time_column, timestamp, list(settings.partition_names))


def _stored_struct(
    order: Sequence[str], types: Mapping[str, pa.DataType], layout: Sequence[str]
) -> T.StructType:
    """How a copy of the batch as stored is read: its data columns, then the layout's.

    Every column nullable, as Spark reads any Parquet file; :data:`DAY` a date.
    """
    kinds = {c: spark_type(types[c]) for c in order} | {DAY: T.DateType()}
    names = [*[c for c in order if c not in layout], *layout]
    return T.StructType([T.StructField(c, kinds[c], True) for c in names])


def _literal(text: str) -> str:
    """A Spark SQL string literal (Spark escapes with backslashes)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


#: The column marking a batch key in a merge's join with the stored rows.
_HIT = "idem_hit"
#: The value Spark writes a NULL partition value (and the empty text) as.
_NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"


#: The column marking the batch's own keys among the stored rows of a merge's join.
_SENT = "idem_sent"


@dataclass(frozen=True)
class _Kept:
    """A merge's stored rows of the window whose key the batch lacks, written beside it."""

    location: str
    #: Row count and hash sum of the kept rows, observed while they were written.
    fingerprint: tuple[int, int]


@dataclass(frozen=True)
class _Joined:
    """What the merge's join with the stored rows counted, besides writing the kept rows."""

    #: The window's rows, those whose key the batch holds, and rows elsewhere it holds a key of
    #: (counted once each where the batch holds each key once, as :attr:`pairs` shows).
    existing: Counts
    matched: Counts
    elsewhere: int
    #: The pairs of the batch's rows of one key, each row paired with itself too: the batch's
    #: row count exactly when no key is NULL or sent twice.
    pairs: int


class SparkTransaction:
    """One publish: a staged version directory, guards as Spark jobs, one metastore commit."""

    def __init__(self, backend: SparkBackend, where: str) -> None:
        """Publish through ``backend``'s session."""
        self.backend = backend
        self.spark = backend.spark
        self.where = where
        self.evaluator = SparkEvaluator(self.spark)
        self.committed: dict[str, Any] = {}
        self._table: _Table | None = None
        self._staged: DataFrame | None = None
        self._duck: DuckDBEvaluator | None = None
        self._stage_dir: str | None = None
        #: The evaluated DataFrame this publish stages; ``_stage_dir`` is its copy when adopted.
        self._frame: SparkFrame | None = None
        self._struct: T.StructType | None = None
        self._layout: tuple[str, ...] = ()
        self._partitions: dict[Spec, catalog.Partition] | None = None
        self._kept: _Kept | None = None
        self._joined: _Joined | None = None
        #: The partitions a version directory holds, listed once.
        self._written: dict[str, list[Spec]] = {}
        #: Files of the kept rows moved into the staged copy, taken out again if it fails.
        self._moved: list[str] = []
        self._plan: _Plan | None = None
        self._done = False

    # Reading ------------------------------------------------------------------------------

    def _current(self) -> _Table:
        if self._table is None:
            raise RuntimeError("describe() reads the table before anything else")
        return self._table

    def describe(self, settings: WriteSettings) -> Snapshot:
        """Read the table's columns, owner, layout and commit counter from the catalog."""
        table = self.backend.table(settings.schema, settings.table)
        self._table = table
        self._owner = settings.asset
        local = table.root.startswith("file:")
        property_sql = f"ALTER TABLE {table.qualified} SET TBLPROPERTIES ('{OWNER}' = '{{asset}}')"
        return Snapshot(
            table=TableRef.of(settings),
            columns=table.columns if table.exists else None,
            owner=table.properties.get(OWNER),
            # Only the commit that creates a table records its owner with its rows.
            claimable=not table.exists,
            handover=f'spark.sql("{property_sql}")',
            path_limit=255 if local else None,
            layout=tuple(c for c in table.layout if c != DAY),
        )

    def stage(self, batch: pa.Table | SparkFrame | Spilled, fitted: Fitted) -> Staged:
        """The batch as stored, where the guards read it.

        A Spark DataFrame was evaluated once, into a version directory of the table
        (:meth:`SparkBackend.evaluate`): when it fits the table unchanged, that copy is the
        staged batch, else it is written once more as stored; the guards' Spark jobs and the
        write read the staged copy. A streamed batch, staged once in DuckDB, is read by Spark
        as that copy's Parquet and written once as stored. An Arrow batch is already whole in
        the driver: the guards judge it in the embedded DuckDB, and Spark reads it as local
        data, written once by the write.
        """
        table = self._current()
        settings = fitted.settings
        types = {f.stored_name: f.stored_type for f in fitted.columns}
        order = list(fitted.order)
        time_column = settings.time_column if settings.partition_columns else None
        layout = self._layout = _stored_layout(table, settings, types)
        if isinstance(batch, SparkFrame):
            self._frame = batch
            if batch.location.startswith(f"{table.root}/") and _unchanged(batch, fitted, layout):
                # The evaluated copy already holds the batch as stored, laid out as the table:
                # nothing is written or cast, so no DataFrame is built over it but its reader.
                self._struct = _stored_struct(order, types, layout)
                self._stage_dir = batch.location
                self._staged = self._read(self._stage_dir)
                relation = self.evaluator.register(self._staged)
                return Staged(relation=relation, evaluator=self.evaluator)
        local = None
        if isinstance(batch, pa.Table):
            local = stored_rows(batch, fitted)
            frame = self.spark.createDataFrame(local, schema=spark_schema(local.schema))
        else:
            sent = (
                batch.read()
                if isinstance(batch, SparkFrame)
                else self.spark.read.parquet(batch.parquet())
            )
            by_name = {f.stored_name: f for f in fitted.columns}
            frame = sent.select(
                *[F.col(f"`{by_name[c].name}`").cast(spark_type(types[c])).alias(c) for c in order]
            )
        if DAY in layout:
            assert time_column is not None
            frame = frame.withColumn(DAY, day_of(time_column, types[time_column]))
        data = [c for c in order if c not in layout]
        fields = {f.name: f for f in frame.schema}
        self._struct = T.StructType([fields[c] for c in (*data, *layout)])
        if local is not None:
            self._staged = frame
            self._duck = embedded()
            return Staged(relation=self._duck.register(local), evaluator=self._duck)
        self._stage_dir = f"{table.root}/{VERSIONS}/{uuid.uuid4().hex}"
        self._write(frame, self._stage_dir)
        self._staged = self._read(self._stage_dir)
        return Staged(relation=self.evaluator.register(self._staged), evaluator=self.evaluator)

    @property
    def _adopted(self) -> SparkFrame | None:
        """The evaluated DataFrame whose copy is the staged batch as it is, if it is."""
        frame = self._frame
        return frame if frame is not None and frame.location == self._stage_dir else None

    def _write(self, frame: DataFrame, location: str) -> None:
        """One job writes ``frame`` into a directory nobody reads yet, by the table's layout."""
        writer = frame.write.mode("errorifexists").format("parquet")
        if self._layout:
            writer = writer.partitionBy(*self._layout)
        writer.save(location)
        # An empty batch writes no file: the directory must still be there to be read.
        catalog.make_directory(self.spark, location)

    def _read(self, location: str) -> DataFrame:
        assert self._struct is not None
        return self.spark.read.schema(self._struct).format("parquet").load(location)

    def _existing(self) -> dict[Spec, catalog.Partition]:
        """The table's partitions and their locations, read from the metastore once."""
        if self._partitions is None:
            table = self._current()
            found = table.exists and self._layout
            self._partitions = catalog.partitions(self.spark, table.db, table.name) if found else {}
        return self._partitions

    def _touched(self, scope: Scope) -> dict[Spec, str]:
        """The table's partitions that may hold rows of the window, and their locations."""
        return {
            s: p.location
            for s, p in self._existing().items()
            if meets(scope.region, s, scope.time_column)
        }

    def profile(self, scope: Scope) -> BatchProfile | None:
        """The batch's profile from work done anyway; ``None``: the guards scan the batch.

        The job that evaluated a DataFrame counted its rows and those with a NULL partition
        value or key; its copy, laid out by the table's partitions, holds no row outside the
        window when the window covers every partition it wrote; and a merge that writes the
        window's kept rows beside the batch finds in that join that no key is sent twice. A
        NULL, a stray row or a key sent twice (whose refusal the guards' scan counts and
        samples), a partition the window covers only in part, and a merge that rewrites the
        window are left to the scan.
        """
        adopted = self._adopted
        if adopted is None:
            return None
        groups = [tuple(c) for c in (scope.pcols, scope.key) if c]
        if any(adopted.nulls.get(g) != 0 for g in groups):
            return None
        if scope.pcols and scope.region and not self._inside(scope, adopted):
            return None
        settings = scope.settings
        if settings.mode == "merge" and not settings.dedupe_order_by and scope.key:
            if not self._merges_beside(scope) or self._join(scope).pairs != adopted.rows:
                # A key sent twice: the guards' scan counts its extra rows for the refusal.
                return None
        return BatchProfile(adopted.rows, 0, 0, 0, 0)

    def _inside(self, scope: Scope, adopted: SparkFrame) -> bool:
        """Whether the window covers every partition the evaluated copy holds rows in.

        A row lies in the partition of its values (the job evaluating it put it there), so
        then no row is outside the window. A partition of a NULL value (or the empty text,
        which Spark stores as NULL) is not covered.
        """
        if not adopted.layout:
            return False
        for spec in self._partitions_in(adopted.location, adopted.layout):
            if any(v == _NULL_PARTITION for _, v in spec):
                return False
            if not covers(scope.region, spec, scope.time_column):
                return False
        return True

    def _partitions_in(self, location: str, layout: Sequence[str]) -> list[Spec]:
        """The partitions a version directory holds (listed once per publish)."""
        if location not in self._written:
            self._written[location] = catalog.written_partitions(self.spark, location, layout)
        return self._written[location]

    def summarize(self, scope: Scope, final: bool = False) -> Summary:
        """Rows the window holds now, and for a merge its keys' rows in and outside it."""
        table = self._current()
        if not table.exists:
            return Summary()
        if scope.settings.mode != "merge":
            return Summary(existing=self._stored_counts(scope))
        assert self._staged is not None
        keys = self._staged.select(*[F.col(f"`{k}`") for k in scope.key])
        if self._merges_beside(scope):
            joined = self._join(scope)
            existing, matched, elsewhere = joined.existing, joined.matched, joined.elsewhere
        else:
            existing = self._stored_counts(scope)
            matched, elsewhere = self._placed_keys(scope, keys)
        sample = None
        if elsewhere and scope.pcols:
            outside = self.evaluator.frame(
                sql.select((table.db, table.name), list(table.columns), scope.region, negate=True)
            )
            sample = outside.join(keys, scope.key, "left_semi").limit(5).toArrow()
        return Summary(existing, matched, elsewhere if scope.pcols else 0, sample)

    def _placed_keys(self, scope: Scope, keys: DataFrame) -> tuple[Counts, int]:
        """The stored rows whose key the batch holds: per partition of the window, and outside.

        One join over the table's keys (narrowed to the batch's key range, which Parquet's
        statistics skip to) places them all.
        """
        table = self._current()
        placed = sql.placed(
            (table.db, table.name), scope.key, scope.region, scope.cells, self._bounds(scope)
        )
        hits = self.evaluator.frame(placed).join(keys, scope.key, "left_semi")
        matched: Counts = {} if scope.cells else {None: 0}
        elsewhere = 0
        for cell, outside, n in hits.groupBy(sql.CELL, sql.OUTSIDE).count().collect():
            if outside:
                elsewhere += int(n)
            elif cell is not None:
                matched[cell if scope.cells else None] = int(n)
        return matched, elsewhere

    def _stored_counts(self, scope: Scope) -> Counts:
        """What the window holds now: from its files' footers where it is whole partitions."""
        found = self._footer_counts(scope)
        if found is not None:
            return found
        table = self._current()
        current = self.evaluator.register(self.backend.window(table, scope.region), "idem_target_")
        return self._counts(current, scope)

    def _footer_counts(self, scope: Scope) -> Counts | None:
        """The window's rows per partition of a range, read from Parquet footers, not scanned.

        Only where the window is whole partitions, so every row of their files is the
        window's (a row lies in the partition of its day: the writes put it there);
        ``None`` where it covers part of one, or a partition holds other than Parquet files.
        """
        if not self._layout:
            return None
        touched, tc = self._touched(scope), scope.time_column
        groups: list[tuple[str | None, Region]] = [(k, (box,)) for k, box in scope.cells]
        counts: Counts = {}
        for key, region in groups or [(None, scope.region)]:
            specs = [s for s in touched if meets(region, s, tc)]
            if not all(covers(region, s, tc) for s in specs):
                return None
            rows = catalog.row_count(self.spark, [touched[s] for s in specs])
            if rows is None:
                return None
            if rows or key is None:
                counts[key] = rows
        return counts

    def _merges_beside(self, scope: Scope) -> bool:
        """Whether a merge writes the window's kept rows beside the staged copy, not both again.

        So it does for an upsert of whole partitions of one window partition; the others (a
        range, ``delete_missing``, ``dedupe_order_by``, part of a partition) rewrite the window.
        """
        settings = scope.settings
        return (
            settings.mode == "merge"
            and self._current().exists
            and self._adopted is not None
            and bool(self._layout)
            and not scope.cells
            and not settings.delete_missing
            and not settings.dedupe_order_by
            and all(covers(scope.region, s, scope.time_column) for s in self._touched(scope))
        )

    def _join(self, scope: Scope) -> _Joined:
        """The merge's join with the stored rows (:meth:`_write_kept`), run once per publish."""
        if self._joined is None:
            assert self._staged is not None
            keys = self._staged.select(*[F.col(f"`{k}`") for k in scope.key])
            self._joined = self._write_kept(scope, keys)
        return self._joined

    def _write_kept(self, scope: Scope, keys: DataFrame) -> _Joined:
        """Write the window's rows whose key the batch lacks; count the window and the keys.

        One job reads the window's partitions, the other partitions' keys in the batch's key
        range and the batch's keys, joins them with the batch's keys, and writes the window's
        rows that no key replaces into a version directory of their own, observing the window's
        rows, those the batch replaces, those outside the window it holds a key of, the batch's
        keys' matches (:attr:`_Joined.pairs`), and the written rows' count and hash sum. The
        write moves them in beside the staged copy.
        """
        table = self._current()
        order = list(scope.fitted.order)
        names = (table.db, table.name)
        window = self.backend.window(table, scope.region).select(
            "*", F.lit("").alias(sql.CELL), F.lit(False).alias(sql.OUTSIDE)
        )
        placed = sql.placed(names, scope.key, scope.region, [], self._bounds(scope))
        outside = self.evaluator.frame(placed).where(F.col(sql.OUTSIDE))
        # The batch's own keys join it too: a key sent n times matches n * n times, so the
        # matches of its keys number its rows exactly when none repeats (no grouping of keys,
        # which costs more than the join).
        sent = keys.withColumn(_SENT, F.lit(True))
        stored = window.unionByName(outside, allowMissingColumns=True)
        stored = stored.unionByName(sent, allowMissingColumns=True)
        hits = keys.withColumn(_HIT, F.lit(True))
        joined = stored.join(hits, scope.key, "left")
        inside, hit = F.col(sql.CELL).isNotNull(), F.col(_HIT).isNotNull()
        counts, seen = Observation(), Observation()
        joined = joined.observe(
            counts,
            *numbered(
                [
                    F.count_if(inside),
                    F.count_if(inside & hit),
                    F.count_if(F.col(sql.OUTSIDE) & hit),
                    F.count_if(F.col(_SENT) & hit),
                ]
            ),
        )
        kept = self._as_batch(joined.where(inside & ~hit), order)
        kept = kept.observe(seen, *numbered(fingerprint_metrics(order)))
        if DAY in self._layout:
            assert scope.time_column is not None
            kind = scope.fitted.partition_types[scope.time_column]
            kept = kept.withColumn(DAY, day_of(scope.time_column, kind))
        location = f"{table.root}/{VERSIONS}/{uuid.uuid4().hex}"
        self._kept = _Kept(location, (0, 0))
        self._write(kept, location)
        found, written = observed(counts), observed(seen)
        if found is None or written is None:
            # The listener never delivered them: count again, and read the kept rows back.
            stored = self._stored_counts(scope)[None]
            matched, elsewhere = self._placed_keys(scope, keys)
            found = [stored, matched[None], elsewhere, keys.join(hits, scope.key).count()]
            written = list(self._read(location).agg(*fingerprint_metrics(order)).first() or ())
        self._kept = _Kept(location, fingerprint(written))
        existing, matched_n, elsewhere_n, pairs_n = (int(v or 0) for v in found)
        return _Joined({None: existing}, {None: matched_n}, elsewhere_n, pairs_n)

    def _bounds(self, scope: Scope) -> dict[str, tuple[Any, Any]]:
        """The batch's smallest and largest key, per key column where they bound it exactly.

        A stored key outside them matches none of the batch's: Parquet's statistics skip the
        files and row groups that hold only such keys.
        """
        adopted = self._adopted
        if adopted is None:
            return {}
        types = {f.name: f.dataType for f in adopted.schema}
        found = {}
        for k in scope.key:
            lo, hi = adopted.bounds.get(k, (None, None))
            exact = isinstance(types.get(k), T.IntegralType | T.StringType | T.DateType)
            if exact and lo is not None and hi is not None:
                found[k] = (lo, hi)
        return found

    def _counts(self, relation: str, scope: Scope) -> Counts:
        ev = self.evaluator
        if scope.cells:
            return {
                k: int(n)
                for k, n in ev.rows(
                    statements.count_by_partition(relation, scope.cells, dialect="spark")
                )
            }
        return {
            None: int(ev.one(statements.count_window(relation, scope.region, dialect="spark"))[0])
        }

    # Writing ------------------------------------------------------------------------------

    def write(self, plan: WritePlan, on_stage: Any) -> Written:
        """The window as it will be, in a version directory; the commit makes it visible."""
        scope = plan.scope
        settings = scope.settings
        table = self._current()
        assert self._staged is not None and self._struct is not None
        order = list(scope.fitted.order)
        batch = self._staged.select(*[F.col(f"`{c}`") for c in order])
        rows: int | None = None
        if settings.mode == "merge" and settings.dedupe_order_by:
            by = settings.dedupe_order_by
            if self._duck is not None:
                q = statements.dedupe(scope.staged.relation.strip('"'), scope.key, by, order)
                kept = self._duck.arrow(q)
                rows = kept.num_rows
                batch = self.spark.createDataFrame(kept, schema=self._data_struct(order))
            else:
                q = statements.dedupe(scope.staged.relation, scope.key, by, order, dialect="spark")
                batch = self.evaluator.frame(q)
        adopted = self._adopted
        if rows is None and settings.mode == "merge":
            # An overwrite's rows are the window's once written (the guards refused any other);
            # a merge's are the batch's, counted when it was evaluated unless deduplicated since.
            counted = adopted.rows if adopted is not None and not settings.dedupe_order_by else None
            rows = batch.count() if counted is None else counted
        on_stage("deleted")
        layout, time_column = self._layout, scope.time_column
        existing = self._existing()
        touched = self._touched(scope)
        partial = [s for s in touched if not covers(scope.region, s, time_column)]
        fingerprints: Fingerprints | None = None
        if self._kept is not None:
            assert adopted is not None
            kept = self._kept
            # The kept rows join the batch's files in the staged copy's partitions.
            self._moved = catalog.move_files(self.spark, kept.location, adopted.location)
            self._written.pop(adopted.location, None)
            version, written = adopted.location, self._read(adopted.location)
            (n, h), (kept_n, kept_h) = adopted.fingerprint, kept.fingerprint
            fingerprints = {None: (n + kept_n, h + kept_h)}
        else:
            version, written = self._rewritten(scope, batch, partial)
            if adopted is not None and version == adopted.location and not scope.cells:
                # The copy is the window, every row of it: its fingerprint was observed.
                fingerprints = {None: adopted.fingerprint}
        moves: dict[Spec, str] = {}
        if layout:
            for spec in self._partitions_in(version, layout):
                moves[spec] = directory(version, spec, layout)
            for spec in touched:
                if spec not in moves:
                    # A window partition the batch empties: an empty directory of its own.
                    moves[spec] = directory(version, spec, layout)
                    catalog.make_directory(self.spark, moves[spec])
        added = [
            (c.column, spark_type(c.type).simpleString())
            for c in scope.fitted.changes
            if c.action == "add_column"
        ]
        replaced = (
            [touched[s] for s in touched] if layout else ([table.location] if table.exists else [])
        )
        self._plan = _Plan(
            version=version,
            create=plan.create,
            moves=moves,
            missing=[s for s in moves if s not in existing],
            added=added,
            order=order,
            struct=self._struct,
            replaced=replaced,
        )
        if fingerprints is None:
            fingerprints = self._fingerprints(written, scope)
        if rows is None:
            rows = sum(n for n, _ in fingerprints.values())
        return Written(rows=rows, fingerprints=fingerprints)

    def _rewritten(
        self, scope: Scope, batch: DataFrame, partial: Sequence[Spec]
    ) -> tuple[str, DataFrame]:
        """Where the window as it will be is, and its rows: the staged copy, or a new version.

        An overwrite of whole partitions keeps the staged copy; a merge that keeps stored
        rows in the window, or a window covering part of a partition, writes them all again.
        """
        settings = scope.settings
        table = self._current()
        order = list(scope.fitted.order)
        layout, time_column = self._layout, scope.time_column
        window = batch
        kept_in_window = settings.mode == "merge" and table.exists and not settings.delete_missing
        if kept_in_window:
            current = self._as_batch(self.backend.window(table, scope.region), order)
            window = window.unionByName(
                current.join(batch.select(*scope.key), scope.key, "left_anti")
            )
        if partial:
            outside = self.evaluator.frame(
                sql.select((table.db, table.name), list(table.columns), scope.region, negate=True)
            )
            types = scope.fitted.partition_types

            def column(c: str) -> Any:
                if c == DAY and time_column:
                    return day_of(time_column, types[time_column])
                return F.col(f"`{c}`")

            def in_spec(spec: Spec) -> Any:
                values = dict(spec)
                terms = [column(c).cast("string") == F.lit(values[c.lower()]) for c in layout]
                return reduce(operator.and_, terms)

            keep = reduce(operator.or_, [in_spec(s) for s in partial])
            window = window.unionByName(self._as_batch(outside.where(keep), order))
        if self._stage_dir is None or kept_in_window or partial or settings.dedupe_order_by:
            version = f"{table.root}/{VERSIONS}/{uuid.uuid4().hex}"
            frame = window
            if DAY in layout:
                assert time_column is not None
                frame = frame.withColumn(
                    DAY, day_of(time_column, scope.fitted.partition_types[time_column])
                )
            self._write(frame, version)
            return version, self._read(version)
        assert self._staged is not None
        return self._stage_dir, self._staged

    def _data_struct(self, order: Sequence[str]) -> T.StructType:
        """The batch's columns as Spark types, in ``order``."""
        assert self._struct is not None
        fields = {f.name: f for f in self._struct}
        return T.StructType([fields[c] for c in order])

    def _as_batch(self, frame: DataFrame, order: Sequence[str]) -> DataFrame:
        """Stored rows in the batch's columns (NULL in a column this publish adds)."""
        assert self._struct is not None
        types = {f.name: f.dataType for f in self._struct}
        have = set(frame.columns)
        return frame.select(
            *[F.col(f"`{c}`") if c in have else F.lit(None).cast(types[c]).alias(c) for c in order]
        )

    def _fingerprints(self, written: DataFrame, scope: Scope) -> Fingerprints:
        ev = self.evaluator
        names = list(scope.fitted.order)
        view = ev.register(written, "idem_target_")
        if scope.cells:
            q = sql.partition_fingerprints(view, names, scope.cells)
            return {k: (int(n), int(d)) for k, n, d in ev.rows(q)}
        count, digest = ev.one(sql.fingerprint(view, names, scope.region))
        return {None: (int(count), int(digest))}

    # Committing ---------------------------------------------------------------------------

    def commit(self) -> None:
        """Make the version directory the window: create, or swap every partition at once."""
        plan = self._plan
        if plan is None:
            return
        table = self._current()
        with table_lock(self.spark, f"{table.db}.{table.name}"):
            self._commit(table, plan)
        spark = self.spark
        self.committed = {"spark_table_version": table.version + 1, "spark_location": plan.version}
        for location in plan.replaced:
            catalog.remove(spark, location)
        if self._stage_dir != plan.version and self._stage_dir is not None:
            catalog.remove(spark, self._stage_dir)
        if self._kept is not None:
            catalog.remove(spark, self._kept.location)
        if self._frame is not None:
            self._frame.committed = self._frame.location == plan.version
            self._frame.discard()

    def _commit(self, table: _Table, plan: _Plan) -> None:
        """The catalog calls of the commit, under the table's lock."""
        spark = self.spark
        if plan.create:
            self._create(table, plan)
        else:
            columns = {COLUMNS: json.dumps(plan.order)}
            now = catalog.advance(spark, table.db, table.name, VERSION, table.version, columns)
            if now != table.version:
                raise CommitConflict(
                    f"table {table.db}.{table.name} was committed to by another writer"
                    f" (version {table.version} -> {now}) while this one wrote"
                )
            if plan.added:
                columns = ", ".join(f"`{c}` {t}" for c, t in plan.added)
                spark.sql(f"ALTER TABLE {table.qualified} ADD COLUMNS ({columns})")
            if self._layout:
                self._add_placeholders(table, plan)
                listed = self._existing()
                catalog.move_partitions(spark, table.db, table.name, plan.moves, listed)
            else:
                spark.sql(f"ALTER TABLE {table.qualified} SET LOCATION {_literal(plan.version)}")
        # Visible now: from here on, the version directory is the table's.
        self._done = True
        spark.catalog.refreshTable(table.qualified)

    def _create(self, table: _Table, plan: _Plan) -> None:
        """Create the table holding the window, owned by the asset, in two catalog calls."""
        spark = self.spark
        self.backend.create_database(table.db)
        data = [f for f in plan.struct if f.name not in self._layout]
        parts = [f for f in plan.struct if f.name in self._layout]
        columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in (*data, *parts))
        partitioned = (
            f" PARTITIONED BY ({', '.join(f'`{c}`' for c in self._layout)})" if self._layout else ""
        )
        location = table.root if self._layout else plan.version
        assert self._owner is not None
        properties = {
            OWNER: self._owner,
            VERSION: "1",
            COLUMNS: json.dumps(plan.order),
            ROOT: table.root,
        }
        try:
            spark.sql(
                f"CREATE TABLE {table.qualified} ({columns}) USING parquet{partitioned}"
                f" LOCATION {_literal(location)} TBLPROPERTIES ({_properties(properties)})"
            )
        except AnalysisException as exc:
            if "ALREADY_EXISTS" in str(exc) or "already exists" in str(exc):
                raise CommitConflict(
                    f"table {table.db}.{table.name} was created meanwhile"
                ) from exc
            raise
        if plan.moves:
            adds = " ".join(
                f"PARTITION ({_spec_sql(spec)}) LOCATION {_literal(loc)}"
                for spec, loc in plan.moves.items()
            )
            spark.sql(f"ALTER TABLE {table.qualified} ADD {adds}")

    def _add_placeholders(self, table: _Table, plan: _Plan) -> None:
        """Register partitions the table lacks on empty directories: readers see no change."""
        if not plan.missing:
            return
        empty = f"{table.root}/{VERSIONS}/{uuid.uuid4().hex}"
        adds: dict[Spec, str | None] = {}
        for spec in plan.missing:
            location = directory(empty, spec, self._layout)
            catalog.make_directory(self.spark, location)
            adds[spec] = location
            plan.replaced.append(location)
        catalog.add_partitions(self.spark, table.db, table.name, adds, if_missing=True)

    _owner: str | None = None

    def abort(self, exc: BaseException | None = None) -> None:
        """Delete what this publish wrote, unless its commit made it visible.

        The evaluated copy of a DataFrame outlives a lost commit (:class:`CommitConflict`):
        the publish starts over on it, as a DataFrame is evaluated only once.
        """
        if self._done:
            return
        for location in self._moved:
            catalog.remove(self.spark, location)
        frame = self._frame
        own = {self._stage_dir, self._plan.version if self._plan else None}
        own.add(self._kept.location if self._kept else None)
        for location in own - {None, frame.location if frame else None}:
            assert location is not None
            catalog.remove(self.spark, location)
        if frame is not None and not isinstance(exc, CommitConflict):
            frame.discard()

    def close(self) -> None:
        """Drop the views this publish registered."""
        self.evaluator.release()
        if self._duck is not None:
            try:
                self._duck.release()
            finally:
                self._duck.conn.close()


def _properties(values: Mapping[str, str]) -> str:
    return ", ".join(f"{_literal(k)} = {_literal(v)}" for k, v in values.items())


def _spec_sql(spec: Spec) -> str:
    return ", ".join(f"`{c}` = {_literal(v)}" for c, v in spec)
