"""Streamed batches: read once into a DuckDB table on disk, judged and written from it.

An asset may return a stream instead of a table: a pyarrow ``RecordBatchReader``, an iterator of
record batches (or tables, or pandas or Polars frames), a Polars ``LazyFrame`` or a DuckDB
relation. The publish reads it exactly once, into a table of a DuckDB database file of its own
(:class:`SpillFile`), written under a memory limit (:func:`spill`); the guards judge that copy,
and the engine's write reads it back batch by batch. No step holds the batch whole, so the
memory a publish takes is set by the limit, not by the batch.

Where the file is attached is the engine's choice: to the target's own database for DuckDB (its
write is then one ``INSERT ... SELECT`` inside the engine), to the process's embedded DuckDB for
the engines whose guards read the batch there (:class:`SpillArea`).
"""

import atexit
import contextlib
import math
import os
import re
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from idem_assets.lib.model.errors import SchemaMismatchError
from idem_assets.lib.model.identifiers import quote
from idem_assets.lib.write.runtime_values import _HEX32, _RANDOM_HEX, _RANDOM_UUID
from idem_assets.lib.write.schema_fit import refuse_repeated_names
from idem_assets.lib.write.seam import EngineBatch, Progress, no_progress

#: The memory DuckDB may take while it stages and judges a streamed batch, unless set otherwise.
DEFAULT_MEMORY = "256MB"
#: Rows per batch read back out of a staged table: DuckDB's row group, so each is one scan step.
CHUNK_ROWS = 122_880
#: How often a long staging reports its progress.
PROGRESS_SECONDS = 10.0
#: The library's own table names are not plain identifiers, so no user table can have one.
SPILL_PREFIX = "idem-spill-"
SPILL_FILE_PREFIX = "idem-spill-file-"
#: Bare-hex values a probe keeps: the run-time check needs four to call a column uuid4().hex.
_HEX_SAMPLE = 4


@dataclass
class Stream:
    """A batch an asset returned as a stream, not read yet: it can be read once."""

    #: The batches, or ``None`` where DuckDB reads a file itself (:attr:`parquet`).
    reader: pa.RecordBatchReader | None
    schema: pa.Schema
    #: A Parquet file holding the batch (a Polars LazyFrame sunk to disk), read by DuckDB.
    parquet: str | None = None
    #: Removes what reading the stream left behind (the Parquet file's folder).
    cleanup: Callable[[], None] = field(default=lambda: None)
    #: Whether a DuckDB relation is being read (its connection is busy until it ends).
    relation: bool = False


@dataclass(frozen=True)
class Batches:
    """Batches an asset yields one at a time, returned as one streamed batch (:func:`batches`)."""

    chunks: Iterable[Any]


def batches(chunks: Iterable[Any]) -> Batches:
    """Return a generator of batches from an asset as one streamed batch, read once.

    Dagster takes a generator an asset returns for the step's own events, so it is wrapped:
    ``return ia.batches(read_pages())``. Each item is a pyarrow RecordBatch or Table, or a
    pandas or Polars DataFrame, every one with the first one's columns.
    """
    return Batches(chunks)


def as_stream(obj: object, asset: str) -> Stream | None:
    """``obj`` as a :class:`Stream` when it is one of the streamed kinds, else ``None``.

    A stream holding one column name twice is refused here, before DuckDB renames the copy.
    """
    stream = _recognised(obj, asset)
    if stream is not None:
        try:
            refuse_repeated_names(stream.schema.names, f"asset '{asset}'", "DuckDB")
        except BaseException:
            stream.cleanup()
            raise
    return stream


def _recognised(obj: object, asset: str) -> Stream | None:
    if isinstance(obj, Stream):
        return obj
    if isinstance(obj, Batches):
        return _chunks(iter(obj.chunks), asset)
    if isinstance(obj, pa.RecordBatchReader):
        reader: pa.RecordBatchReader = obj
        return Stream(reader, reader.schema)
    if isinstance(obj, duckdb.DuckDBPyRelation):
        return _relation(obj, asset)
    lazy = _polars_lazy(obj)
    if lazy is not None:
        return _sunk(lazy)
    if isinstance(obj, Iterator):
        return _chunks(obj, asset)
    return None


def _relation(relation: duckdb.DuckDBPyRelation, asset: str) -> Stream:
    """A DuckDB relation read by DuckDB as Arrow batches (no row passes through Python)."""
    try:
        reader = relation.to_arrow_reader(CHUNK_ROWS)
    except duckdb.ConnectionException as exc:
        raise SchemaMismatchError(
            f"Refused to write asset '{asset}': it returned a DuckDB relation whose connection"
            f" is closed ({exc}), so its rows cannot be read. Nothing was changed. Fix: build"
            " the relation on a connection the asset does not close (e.g. conn ="
            " duckdb.connect('warehouse.duckdb', read_only=True); return conn.sql(...)); a"
            " DuckDBResource's `with` block closes its connection when the asset returns), or"
            " return relation.to_arrow_table() for a batch that fits in memory."
        ) from exc
    return Stream(reader, reader.schema, relation=True)


def _polars_lazy(obj: object) -> Any:
    """``obj`` if it is a Polars LazyFrame (Polars stays optional), else ``None``."""
    import sys

    pl: Any = sys.modules.get("polars")
    return obj if pl is not None and isinstance(obj, pl.LazyFrame) else None


def _sunk(frame: Any) -> Stream:
    """A LazyFrame run by Polars' streaming engine into a Parquet file, never collected."""
    import pyarrow.parquet as pq

    folder = Path(tempfile.mkdtemp(prefix="idem-lazy-", dir=spill_root()))
    path = folder / "batch.parquet"
    try:
        frame.sink_parquet(path)
        schema = pq.read_schema(path)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return Stream(None, schema, str(path), lambda: shutil.rmtree(folder, ignore_errors=True))


def _chunks(chunks: Iterator[Any], asset: str) -> Stream:
    """An iterator of batches as a reader; its first batch names the columns."""
    first = next(chunks, None)
    if first is None:
        raise SchemaMismatchError(
            f"Refused to write asset '{asset}': it returned an iterator that yielded no batch,"
            " so there are no columns to check the table against. Nothing was changed. Fix:"
            " yield one empty batch with the columns (pa.RecordBatch.from_pylist([],"
            " schema=...)), and set metadata={'allow_empty': True} if the partition really has"
            " no rows."
        )
    head = _as_batches(first, asset, 1)
    schema = head[0].schema if head else _as_table(first, asset, 1).schema

    def batches() -> Iterator[pa.RecordBatch]:
        yield from head
        for number, chunk in enumerate(chunks, start=2):
            for batch in _as_batches(chunk, asset, number):
                if batch.schema != schema:
                    batch = _conformed(batch, schema, asset, number)
                yield batch

    return Stream(pa.RecordBatchReader.from_batches(schema, batches()), schema)


def _as_table(chunk: Any, asset: str, number: int) -> pa.Table:
    from idem_assets.lib.dagster_layer.frames import to_arrow

    if isinstance(chunk, pa.RecordBatch):
        return pa.Table.from_batches([chunk])
    try:
        return to_arrow(chunk, asset)
    except TypeError:
        raise SchemaMismatchError(
            f"Refused to write asset '{asset}': batch {number} of the iterator it returned is a"
            f" {type(chunk).__name__}. Nothing was changed. Fix: yield pyarrow RecordBatches or"
            " Tables, or pandas or Polars DataFrames, all with the same columns."
        ) from None


def _as_batches(chunk: Any, asset: str, number: int) -> list[pa.RecordBatch]:
    if isinstance(chunk, pa.RecordBatch):
        return [chunk]
    return _as_table(chunk, asset, number).combine_chunks().to_batches()


def _conformed(batch: pa.RecordBatch, schema: pa.Schema, asset: str, number: int) -> pa.RecordBatch:
    """A later batch in the first one's types; a batch with other columns is refused."""
    if batch.schema.names == schema.names:
        try:
            return batch.cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    raise SchemaMismatchError(
        f"Refused to write asset '{asset}': batch {number} of the iterator it returned has"
        f" columns {_spelt(batch.schema)}, where the first batch has {_spelt(schema)}. A batch"
        " is one table: every part of it must have the same columns and types. Nothing was"
        " changed. Fix: give every yielded batch the first one's columns and types (e.g."
        " batch.cast(schema))."
    )


def _spelt(schema: pa.Schema) -> str:
    return "[" + ", ".join(f"{f.name} {f.type}" for f in schema) + "]"


def cast_reader(reader: pa.RecordBatchReader, schema: pa.Schema | None) -> pa.RecordBatchReader:
    """``reader``'s batches in ``schema``'s columns and types (DuckDB gives its own types back)."""
    if schema is None or reader.schema == schema:
        return reader
    names = schema.names
    return pa.RecordBatchReader.from_batches(schema, (b.select(names).cast(schema) for b in reader))


@dataclass(frozen=True)
class SpillArea:
    """The DuckDB connection a streamed batch is staged in, and how its view lives there."""

    conn: duckdb.DuckDBPyConnection
    #: A TEMP table or view of this connection (the target's own DuckDB, whose every transaction
    #: runs on it), or one of the database every cursor of the embedded DuckDB sees.
    temporary: bool
    #: Whether a stream outgrowing half the limit moves to a :class:`SpillFile`, for an engine
    #: that writes by scanning the copy; otherwise it stays in a table DuckDB evicts to its
    #: temporary files.
    files: bool = False

    @contextlib.contextmanager
    def cursor(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """Where statements on the staged table run.

        The connection itself for a TEMP view, else a cursor of their own (closed after),
        which another's open result cannot block.
        """
        if self.temporary:
            yield self.conn
            return
        with self.conn.cursor() as cursor:
            yield cursor


@dataclass(frozen=True)
class SpillFile:
    """A DuckDB database file of one staged batch, attached to its area's database.

    A table of a database file is stored compressed (a third of its size as Arrow), where a
    table in memory spills to DuckDB's temporary files as it is held: past the memory limit
    every scan of the copy (each guard's, the write's) then reads far less from disk.
    """

    alias: str
    path: Path

    @classmethod
    def attach(cls, area: SpillArea) -> "SpillFile":
        """A new, empty file in this process's staging folder, attached to ``area``'s database."""
        alias = SPILL_FILE_PREFIX + uuid.uuid4().hex
        path = spill_root() / f"{alias}.duckdb"
        # A cursor of its own: the database sees the file from every connection, and the
        # area's connection may hold an open result (a relation being staged from it).
        with area.conn.cursor() as cursor:
            cursor.execute(f"ATTACH ? AS {quote(alias)}", [str(path)]).fetchall()
        return cls(alias, path)

    def table(self, name: str) -> str:
        """The qualified name of the file's table ``name``."""
        return f"{quote(self.alias)}.main.{quote(name)}"

    def detach(self, area: SpillArea) -> None:
        """Detach the file from ``area``'s database and remove it."""
        with contextlib.suppress(duckdb.Error), area.conn.cursor() as cursor:
            cursor.execute(f"DETACH DATABASE IF EXISTS {quote(self.alias)}").fetchall()
        for path in (self.path, self.path.with_name(self.path.name + ".wal")):
            path.unlink(missing_ok=True)


class Spilled:
    """A streamed batch staged once in a DuckDB table, where the guards read it."""

    def __init__(
        self,
        area: SpillArea,
        name: str,
        schema: pa.Schema,
        rows: int,
        memory: str,
        file: "SpillFile | None" = None,
    ) -> None:
        """``rows`` rows of ``schema`` (the source's) read as ``name`` of ``area``.

        ``name`` is a table of ``area`` held in memory, or a view over the table of ``file``.
        """
        self.area = area
        self.name = name
        self.file = file
        #: The columns and types as the asset returned them; reads are cast back to them.
        self.schema = schema
        self.num_rows = rows
        self.memory = memory
        self._parquet: str | None = None

    @property
    def relation(self) -> str:
        """The quoted name the staged rows are read by: their table, or a view over it."""
        return quote(self.name)

    def reader(self) -> pa.RecordBatchReader:
        """The staged rows batch by batch, in the asset's own types."""
        # A cursor of its own: DuckDB refuses other work on a connection with an open result.
        cursor = self.area.conn if self.area.temporary else self.area.conn.cursor()
        found = cursor.sql(f"SELECT * FROM {self.relation}").to_arrow_reader(CHUNK_ROWS)
        return cast_reader(found, self.schema)

    def chunks(self) -> Iterator[pa.Table]:
        """Every row as the asset returned it, a bounded table at a time."""
        for batch in self.reader():
            yield pa.Table.from_batches([batch])

    def parquet(self) -> str:
        """The staged rows as a Parquet file on this machine, written once, removed with them.

        For an engine that reads files rather than Arrow (Spark, whose executors read it where
        they share this machine's disk).
        """
        if self._parquet is None:
            folder = Path(tempfile.mkdtemp(prefix="idem-export-", dir=spill_root()))
            path = str(folder / "batch.parquet")
            nanos = [f.name for f in self.schema if pa.types.is_timestamp(f.type)]
            nanos = [n for n in nanos if self.schema.field(n).type.unit == "ns"]
            if nanos:
                # Readers of Parquet (Spark) take no nanosecond timestamps: floored to
                # microseconds, as an engine storing microseconds stores them.
                self._write_floored(path, nanos)
            else:
                with self.area.cursor() as cursor:
                    cursor.execute(f"COPY {self.relation} TO ? (FORMAT parquet)", [path]).fetchall()
            self._parquet = path
        return self._parquet

    def _write_floored(self, path: str, nanos: list[str]) -> None:
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        fields = [
            f.with_type(pa.timestamp("us", f.type.tz)) if f.name in nanos else f
            for f in self.schema
        ]
        schema = pa.schema(fields)
        with pq.ParquetWriter(path, schema) as writer:
            for chunk in self.chunks():
                for name in nanos:
                    at = chunk.schema.get_field_index(name)
                    floored = pc.floor_temporal(chunk.column(at), unit="microsecond")  # pyright: ignore[reportAttributeAccessIssue]
                    chunk = chunk.set_column(at, name, floored.cast(schema.field(name).type))
                writer.write_table(chunk)

    def derived(self, query: str) -> "Spilled":
        """A staged copy of ``query``'s rows over this one (a deduplication), this one dropped."""
        name = SPILL_PREFIX + uuid.uuid4().hex
        try:
            with self.area.cursor() as cursor:
                if self.file is None:
                    cursor.execute(f"CREATE {_kind(self.area)} {quote(name)} AS {query}").fetchall()
                else:
                    table = self.file.table(name)
                    cursor.execute(f"CREATE TABLE {table} AS {query}").fetchall()
                    _view(cursor, self.area, name, table)
                rows = cursor.execute(f"SELECT count(*) FROM {quote(name)}").fetchall()[0][0]
        except BaseException:
            self.drop()
            raise
        # The copy keeps the file, if any: only this one's rows go.
        self._drop_rows()
        return Spilled(self.area, name, self.schema, int(rows), self.memory, self.file)

    def batch(self) -> EngineBatch:
        """This staged copy as the publish takes a batch that stays in its engine."""
        return EngineBatch(frame=self, probe=probe(self), values=self.chunks)

    def drop(self) -> None:
        """Drop the staged rows, and the file holding them; DuckDB frees their memory."""
        if self._parquet is not None:
            shutil.rmtree(Path(self._parquet).parent, ignore_errors=True)
        self._drop_rows()
        if self.file is not None:
            self.file.detach(self.area)

    def _drop_rows(self) -> None:
        # A cursor of its own (for a TEMP table, the connection): an open result cannot refuse it.
        with contextlib.suppress(duckdb.Error), self.area.cursor() as cursor:
            if self.file is None:
                cursor.execute(f"DROP TABLE IF EXISTS {self.relation}").fetchall()
                return
            cursor.execute(f"DROP VIEW IF EXISTS {self.relation}").fetchall()
            cursor.execute(f"DROP TABLE IF EXISTS {self.file.table(self.name)}").fetchall()


@contextlib.contextmanager
def spilled(
    stream: Stream | Spilled,
    area: SpillArea,
    memory: str = DEFAULT_MEMORY,
    progress: Progress = no_progress,
) -> Iterator[Spilled]:
    """``stream`` staged in ``area`` (read once, into a table), dropped when the block ends.

    A batch already staged elsewhere (by an audit, in the embedded DuckDB) is copied into
    ``area`` batch by batch when the engine stages in its own database.
    """
    try:
        _size(memory)
    except BaseException:
        if isinstance(stream, Stream):
            stream.cleanup()
        raise
    with memory_limited(area.conn, memory):
        if isinstance(stream, Spilled) and stream.area.conn is area.conn:
            yield stream
            return
        copy = (
            spill(Stream(stream.reader(), stream.schema), area, memory, progress)
            if isinstance(stream, Spilled)
            else spill(stream, area, memory, progress)
        )
        try:
            yield copy
        finally:
            copy.drop()


def spill(
    stream: Stream, area: SpillArea, memory: str, progress: Progress = no_progress
) -> Spilled:
    """Read ``stream`` once into a new table of ``area``; the caller limits the memory.

    The table is held in memory while the rows take at most half of ``memory``; a stream
    outgrowing that moves to a :class:`SpillFile`, where the rest of it follows, in an area
    that stages in files (:attr:`SpillArea.files`).
    """
    name = SPILL_PREFIX + uuid.uuid4().hex
    counted = _Counted(stream, progress)
    cap = _bytes(memory) / 2 if area.files else math.inf
    file = None
    with area.cursor() as cursor, _read_once(stream, cursor, counted) as sources:
        try:
            if stream.parquet is not None:
                source = "read_parquet(?)"
                if _parquet_bytes(stream.parquet) <= cap:
                    _create(cursor, area, name, source, [stream.parquet])
                else:
                    file = SpillFile.attach(area)
                    _create_in(cursor, area, file, name, source, [stream.parquet])
            else:
                head = _Head(counted.batches(), cap)
                first = _registered(cursor, head.reader(stream.schema), sources)
                _create(cursor, area, name, first)
                if head.outgrown:
                    file = _moved(cursor, area, name)
                    rest = pa.RecordBatchReader.from_batches(stream.schema, head.rest)
                    into = f"INSERT INTO {file.table(name)} SELECT * FROM"
                    cursor.execute(f"{into} {_registered(cursor, rest, sources)}").fetchall()
        except BaseException as exc:
            _drop_staged(cursor, area, name, file)
            if stream.relation and "result" in str(exc) and counted.error is None:
                raise _busy_relation() from exc
            raise
        rows = cursor.execute(f"SELECT count(*) FROM {quote(name)}").fetchall()
    count = int(rows[0][0]) if rows else 0
    staged = Spilled(area, name, plain(stream.schema), count, memory, file)
    refuse_lost_types(staged)
    held = "in memory" if file is None else "on disk"
    progress(
        f"Staged {staged.num_rows:,} rows in {counted.elapsed():.1f} s (DuckDB, {memory}, {held})."
    )
    return staged


def read_types(stream: Stream, conn: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """Each column of ``stream`` and the DuckDB type it is read as, without reading a row."""
    if stream.parquet is not None:
        found = conn.execute("DESCRIBE SELECT * FROM read_parquet(?)", [stream.parquet])
        return {row[0]: row[1] for row in found.fetchall()}
    name = "idem-source-" + uuid.uuid4().hex
    conn.register(name, pa.RecordBatchReader.from_batches(stream.schema, iter(())))
    try:
        found = conn.execute(f"DESCRIBE SELECT * FROM {quote(name)}")
        return {row[0]: row[1] for row in found.fetchall()}
    finally:
        conn.unregister(name)


def insert(
    stream: Stream, conn: duckdb.DuckDBPyConnection, table: str, progress: Progress = no_progress
) -> tuple[int, float]:
    """Read ``stream`` once into ``table`` by column name: the rows inserted, and the seconds.

    The caller's transaction holds the rows; the stream's leftovers are cleaned up once read.
    """
    counted = _Counted(stream, progress)
    with _read_once(stream, conn, counted) as sources:
        source, params = _source(stream, conn, counted, sources)
        done = conn.execute(f"INSERT INTO {table} BY NAME SELECT * FROM {source}", params)
        rows = int(done.fetchall()[0][0])
    return rows, counted.elapsed()


@dataclass(frozen=True)
class ParquetCopy:
    """A stream read once into one Parquet file: its rows, seconds and statistics."""

    rows: int
    seconds: float
    #: Per column (by its plain name): DuckDB's ``min``, ``max`` and ``null_count``, as text.
    statistics: dict[str, dict[str, str]]


def copy_to_parquet(
    stream: Stream, conn: duckdb.DuckDBPyConnection, path: str, progress: Progress = no_progress
) -> ParquetCopy:
    """Read ``stream`` once into the Parquet file ``path`` (Snappy, as delta-rs writes).

    DuckDB encodes the file on every core, under the caller's memory limit; the stream's
    leftovers are cleaned up once read.
    """
    counted = _Counted(stream, progress)
    with _read_once(stream, conn, counted) as sources:
        source, params = _source(stream, conn, counted, sources)
        done = conn.execute(
            f"COPY (SELECT * FROM {source}) TO ? (FORMAT parquet, COMPRESSION snappy,"
            " RETURN_STATS)",
            [*params, path],
        )
        names = [d[0] for d in done.description or []]
        found = dict(zip(names, done.fetchall()[0], strict=True))
    statistics = {
        name.strip('"').replace('""', '"'): dict(values)
        for name, values in (found["column_statistics"] or {}).items()
    }
    return ParquetCopy(int(found["count"]), counted.elapsed(), statistics)


def _source(
    stream: Stream, conn: duckdb.DuckDBPyConnection, counted: "_Counted", sources: list[str]
) -> tuple[str, list[Any]]:
    """Where DuckDB reads ``stream`` from once (its Parquet file, or its counted batches)."""
    if stream.parquet is not None:
        return "read_parquet(?)", [stream.parquet]
    reader = pa.RecordBatchReader.from_batches(stream.schema, counted.batches())
    return _registered(conn, reader, sources), []


@contextlib.contextmanager
def _read_once(
    stream: Stream, conn: duckdb.DuckDBPyConnection, counted: "_Counted"
) -> Iterator[list[str]]:
    """Where ``stream`` is read: the names its readers are registered under, dropped after.

    A failure the source raised is reported as itself, not as DuckDB's wrapping of it, and
    what the stream left behind is cleaned up however the read ends.
    """
    sources: list[str] = []
    try:
        yield sources
    except BaseException as exc:
        if counted.error is not None and counted.error is not exc:
            raise counted.error from exc
        raise
    finally:
        for source in sources:
            with contextlib.suppress(duckdb.Error):
                conn.unregister(source)
        stream.cleanup()


def _kind(area: SpillArea) -> str:
    return "TEMP TABLE" if area.temporary else "TABLE"


def _view(cursor: duckdb.DuckDBPyConnection, area: SpillArea, name: str, table: str) -> None:
    """The view ``name`` the guards and the write read ``table`` through."""
    kind = "TEMP VIEW" if area.temporary else "VIEW"
    cursor.execute(f"CREATE {kind} {quote(name)} AS SELECT * FROM {table}").fetchall()


def _create(
    cursor: duckdb.DuckDBPyConnection,
    area: SpillArea,
    name: str,
    source: str,
    params: list[Any] | None = None,
) -> None:
    """The in-memory table ``name`` of ``area`` holding ``source``'s rows."""
    cursor.execute(
        f"CREATE {_kind(area)} {quote(name)} AS SELECT * FROM {source}", params or []
    ).fetchall()


def _create_in(
    cursor: duckdb.DuckDBPyConnection,
    area: SpillArea,
    file: SpillFile,
    name: str,
    source: str,
    params: list[Any] | None = None,
) -> None:
    """The table ``name`` of ``file`` holding ``source``'s rows, read as the view ``name``."""
    table = file.table(name)
    cursor.execute(f"CREATE TABLE {table} AS SELECT * FROM {source}", params or []).fetchall()
    _view(cursor, area, name, table)


def _moved(cursor: duckdb.DuckDBPyConnection, area: SpillArea, name: str) -> SpillFile:
    """The in-memory table ``name`` moved into a new file, read by a view of that name."""
    file = SpillFile.attach(area)
    try:
        table = file.table(name)
        cursor.execute(f"CREATE TABLE {table} AS SELECT * FROM {quote(name)}").fetchall()
        cursor.execute(f"DROP TABLE {quote(name)}").fetchall()
        _view(cursor, area, name, table)
    except BaseException:
        file.detach(area)
        raise
    return file


def _drop_staged(
    cursor: duckdb.DuckDBPyConnection, area: SpillArea, name: str, file: SpillFile | None
) -> None:
    """Whatever a failed staging left: the table or view ``name``, and the file."""
    with contextlib.suppress(duckdb.Error):
        cursor.execute(f"DROP VIEW IF EXISTS {quote(name)}").fetchall()
    with contextlib.suppress(duckdb.Error):
        cursor.execute(f"DROP TABLE IF EXISTS {quote(name)}").fetchall()
    if file is not None:
        file.detach(area)


def _registered(
    cursor: duckdb.DuckDBPyConnection, reader: pa.RecordBatchReader, names: list[str]
) -> str:
    """``reader`` registered on ``cursor`` under a name of its own, added to ``names``."""
    source = "idem-source-" + uuid.uuid4().hex
    cursor.register(source, reader)
    names.append(source)
    return quote(source)


def _parquet_bytes(path: str) -> int:
    """The rows of a Parquet file as they take memory, uncompressed."""
    import pyarrow.parquet as pq

    meta = pq.read_metadata(path)
    return sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))


class _Head:
    """A stream's first batches, up to ``cap`` bytes; :attr:`rest` goes on where they end."""

    def __init__(self, batches: Iterator[pa.RecordBatch], cap: float) -> None:
        self.rest, self.cap = batches, cap
        #: Whether the stream went on past the cap (its first batches are then all read).
        self.outgrown = False

    def reader(self, schema: pa.Schema) -> pa.RecordBatchReader:
        return pa.RecordBatchReader.from_batches(schema, self._batches())

    def _batches(self) -> Iterator[pa.RecordBatch]:
        size = 0
        # Returning from the loop leaves the stream open: the rest is read from where it stops.
        for batch in self.rest:
            yield batch
            size += batch.nbytes
            if size > self.cap:
                self.outgrown = True
                return


def _busy_relation() -> SchemaMismatchError:
    return SchemaMismatchError(
        "Refused to stage a DuckDB relation of the connection it is published to: reading it"
        " keeps that connection busy, so the publish cannot stage it there. Nothing was"
        " changed. Fix: build the relation on a cursor of the connection (rel ="
        " conn.cursor().sql(...)), which reads the same database beside it."
    )


def plain(schema: pa.Schema) -> pa.Schema:
    """``schema`` with each dictionary column as its values' type, which every engine stores.

    A dictionary's index type belongs to the batches it came in: DuckDB gives the copy back in
    other batches, whose categories may not fit it (128 of them in an int8 index).
    """
    return pa.schema(
        [f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f for f in schema],
        metadata=schema.metadata,
    )


class Ticker:
    """When a long read says how far it got: at most once every :data:`PROGRESS_SECONDS`."""

    def __init__(self) -> None:
        self.start = self._said = time.monotonic()

    def elapsed(self) -> float:
        """The seconds since the read began."""
        return time.monotonic() - self.start

    def due(self) -> float | None:
        """The seconds since the start if it is time to report, else ``None``."""
        now = time.monotonic()
        if now - self._said < PROGRESS_SECONDS:
            return None
        self._said = now
        return now - self.start


class _Counted:
    """A stream's batches counted as DuckDB reads them, reporting now and then."""

    def __init__(self, stream: Stream, progress: Progress) -> None:
        self.stream, self.progress = stream, progress
        self.rows, self.error = 0, None
        self.ticker = Ticker()

    def elapsed(self) -> float:
        return self.ticker.elapsed()

    def batches(self) -> Iterator[pa.RecordBatch]:
        assert self.stream.reader is not None
        try:
            for batch in self.stream.reader:
                self.rows += batch.num_rows
                seconds = self.ticker.due()
                if seconds is not None:
                    self.progress(f"Staging: {self.rows:,} rows read in {seconds:.0f} s.")
                yield batch
        except (Exception, KeyboardInterrupt) as exc:
            # The source's own failure; a GeneratorExit is DuckDB closing the read, whose own
            # error (a full disk, its memory limit) is then the one to report.
            self.error = exc
            raise


def refuse_lost_types(staged: Spilled) -> None:
    """Refuse a column DuckDB stores in a type that cannot give the asset's values back."""
    with staged.area.cursor() as cursor:
        stored = cursor.sql(f"SELECT * FROM {staged.relation} LIMIT 0").to_arrow_table()
    lost = []
    for f in staged.schema:
        back = stored.schema.field(f.name).type
        if back == f.type:
            continue
        try:
            pa.array([], back).cast(f.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            lost.append(f"{f.name} ({f.type}, staged as {back})")
    if lost:
        staged.drop()
        raise SchemaMismatchError(
            f"Refused to stage a streamed batch: DuckDB, which stages it, cannot give back the"
            f" values of {lost} in their own type. Nothing was changed. Fix: cast those columns"
            " to a type DuckDB holds (e.g. float16 to float32, decimal256 to decimal128, a"
            " duration to int64 of its unit, an extension type to its storage type) before"
            " returning the stream, or return a pyarrow Table."
        )


_LIMITS_LOCK = threading.Lock()


@dataclass
class _Limit:
    """One database's limit while streamed publishes run on it, and what to put back after."""

    before: str
    default: bool
    #: The size each publish running now asked for; the database gets the largest.
    asked: list[str] = field(default_factory=list)


_LIMITS: dict[str, _Limit] = {}


@contextlib.contextmanager
def memory_limited(conn: duckdb.DuckDBPyConnection, memory: str) -> Iterator[None]:
    """``conn``'s database under ``memory`` while the block runs, its own limit restored after.

    DuckDB's limit belongs to the database, which the target's may share with the asset's own
    connections and with other publishes of this process: while several run, it is the largest
    any of them asked for, and the last to end puts the database's own limit back. DuckDB reads
    a limit back only as it shows it (one decimal, '2.7 GiB'), so a default limit is restored
    exactly (RESET) and one set by hand to within that precision.
    """
    asked = _size(memory)
    key = _database(conn)
    with _LIMITS_LOCK:
        held = _LIMITS.get(key)
        if held is None:
            before = _shown(conn)
            _run(conn, "RESET memory_limit")
            held = _LIMITS[key] = _Limit(before, _shown(conn) == before)
        held.asked.append(asked)
        try:
            _run(conn, f"SET memory_limit = '{max(held.asked, key=_bytes)}'")
        except duckdb.Error as exc:
            _give_back(conn, key, held, asked)
            exc.add_note(
                f"DuckDB could not hold its database to staging_memory {asked!r}: the database"
                " holds more than that and has nowhere to write it out (a database in memory"
                " without a temp_directory, or a full one). Nothing was staged or changed. Fix:"
                " raise staging_memory, or give DuckDB a temp_directory with room."
            )
            raise
    try:
        yield
    finally:
        with _LIMITS_LOCK:
            _give_back(conn, key, held, asked)


def _give_back(conn: duckdb.DuckDBPyConnection, key: str, held: "_Limit", asked: str) -> None:
    """Drop one publish's ``asked`` from ``held``; the database's limit follows what is left."""
    held.asked.remove(asked)
    # The publish's own error is the one to report: putting a limit back never hides it.
    with contextlib.suppress(Exception):
        if held.asked:
            _run(conn, f"SET memory_limit = '{max(held.asked, key=_bytes)}'")
        elif held.default:
            _run(conn, "RESET memory_limit")
        else:
            _run(conn, f"SET memory_limit = '{_midway(held.before)}'")
    if not held.asked:
        del _LIMITS[key]


@contextlib.contextmanager
def memory_lent(conn: duckdb.DuckDBPyConnection, memory: str, kept: str) -> Iterator[None]:
    """One publish's share ``memory`` of ``conn``'s limit cut to ``kept`` while the block runs.

    For an engine that writes the staged rows while DuckDB only scans them: DuckDB writes out
    what it held past ``kept`` and frees it for the engine's writer. The database's other
    publishes keep what they asked for; one whose limit no publish set is left as it is.
    """
    asked, smaller = _size(memory), _size(kept)
    key = _database(conn)
    with _LIMITS_LOCK:
        held = _LIMITS.get(key)
        if held is None or asked not in held.asked:
            held = None
        else:
            held.asked[held.asked.index(asked)] = smaller
            # Past a full temporary directory DuckDB keeps what it holds: the write goes on.
            with contextlib.suppress(duckdb.Error):
                _run(conn, f"SET memory_limit = '{max(held.asked, key=_bytes)}'")
    try:
        yield
    finally:
        if held is not None:
            with _LIMITS_LOCK:
                held.asked[held.asked.index(smaller)] = asked
                with contextlib.suppress(Exception):
                    _run(conn, f"SET memory_limit = '{max(held.asked, key=_bytes)}'")


def _run(conn: duckdb.DuckDBPyConnection, statement: str) -> None:
    # A cursor of its own: the connection may be another thread's, or hold an open result.
    with conn.cursor() as cursor:
        cursor.execute(statement).fetchall()


def _shown(conn: duckdb.DuckDBPyConnection) -> str:
    with conn.cursor() as cursor:
        return cursor.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]


def _database(conn: duckdb.DuckDBPyConnection) -> str:
    """Which database ``conn`` is on: its file, or for one in memory the connection itself."""
    return database_file(conn) or f"memory-{id(conn)}"


def database_file(conn: duckdb.DuckDBPyConnection) -> str | None:
    """The file of ``conn``'s current database; ``None`` for a database in memory."""
    with conn.cursor() as cursor:
        found = cursor.execute(
            "SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
        ).fetchall()
    return (found[0][0] if found else None) or None


_UNITS = {
    "": 1,
    "BYTES": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
    "PIB": 2**50,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGTP]?I?B|BYTES)?\s*", re.IGNORECASE)
#: A size DuckDB takes for a limit: it refuses a bare number and peta-units.
_ASKED = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B|BYTES)\s*", re.IGNORECASE)


def _bytes(text: str) -> float:
    found = _SIZE.fullmatch(text)
    assert found is not None, text
    return float(found.group(1)) * _UNITS[(found.group(2) or "").upper()]


def _midway(shown: str) -> str:
    """A limit DuckDB shows with one decimal ('2.7 GiB'), set as the middle of what it may be.

    The shown decimal is cut, not rounded: 3GB shows as '2.7 GiB' and is 2.79 GiB, so setting
    '2.7 GiB' itself would show as '2.6 GiB'. No limit at all shows as petabytes: '-1'.
    """
    found = _SIZE.fullmatch(shown)
    if found is None or (found.group(2) or "").upper() == "PIB":
        return "-1"
    number, unit = found.group(1), found.group(2) or "bytes"
    if "." not in number:
        return f"{number} {unit}"
    return f"{float(number) + 0.05:.2f} {unit}"


def _size(text: str) -> str:
    """A memory size as DuckDB spells one (``256MB``, ``1.5 GiB``); anything else is refused."""
    if not _ASKED.fullmatch(text) or _bytes(text) < 16 * 10**6:
        from idem_assets.lib.model.errors import ConfigurationError

        raise ConfigurationError(
            f"staging_memory {text!r} is not a memory size of at least 16MB. Fix: a number and"
            " a unit (B, KB, MB, GB, TB, KiB, MiB, GiB or TiB), e.g. '256MB', '1GB' or '2GiB'."
        )
    return text.strip()


def half(memory: str) -> str:
    """Half of the memory size ``memory``, in bytes, never under the 16MB a limit needs."""
    return f"{max(_bytes(_size(memory)) // 2, 16 * 10**6):.0f}B"


def probe(staged: Spilled) -> pa.Table:
    """The values the checks before staging read, picked out of the staged table by DuckDB.

    Each ordered column's smallest and largest value, and for text and 16-byte binary the values
    the run-time check looks for (a random uuid, bare hex): those checks decide on this table
    exactly as on every row. Values come back in the asset's own types.
    """
    found: dict[str, list[pa.Array]] = {f.name: [] for f in staged.schema}
    ordered = [f for f in staged.schema if _ordered(f.type)]
    with staged.area.cursor() as cursor:
        if ordered:
            picks = ", ".join(f"min({quote(f.name)}), max({quote(f.name)})" for f in ordered)
            row = cursor.sql(f"SELECT {picks} FROM {staged.relation}").to_arrow_table()
            for i, f in enumerate(ordered):
                found[f.name] += [row.column(j).combine_chunks() for j in (2 * i, 2 * i + 1)]
        for f in staged.schema:
            text = _uuid_text(f)
            if text is not None:
                found[f.name] += _uuid_like(cursor, staged.relation, f.name, text)
    height = max((sum(len(a) for a in arrays) for arrays in found.values()), default=0)
    columns = []
    for f in staged.schema:
        arrays = [a.cast(f.type) for a in found[f.name]]
        values = pa.concat_arrays(arrays) if arrays else pa.array([], f.type)
        pad = pa.nulls(height - len(values), f.type)
        columns.append(pa.concat_arrays([values, pad]) if len(pad) else values)
    return pa.Table.from_arrays(columns, schema=staged.schema)


def _ordered(kind: pa.DataType) -> bool:
    """Types whose extremes decide the checks on values (ranges, run-time stamps)."""
    if pa.types.is_dictionary(kind):
        return False
    # Not text: its run-time check reads the uuid picks, which an extreme would count twice.
    return (
        pa.types.is_integer(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_decimal(kind)
        or pa.types.is_temporal(kind)
    )


def _uuid_text(f: pa.Field) -> str | None:
    """SQL spelling a column's values as uuid text is matched, or ``None`` if none can be one."""
    kind = f.type
    if isinstance(kind, pa.ExtensionType):
        kind = kind.storage_type
    column = quote(f.name)
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return f"CAST({column} AS VARCHAR)"
    if pa.types.is_fixed_size_binary(kind) and kind.byte_width == 16:
        # Bytes as 32 hex digits: the version and variant sit where _RANDOM_HEX looks.
        return f"lower(hex({column}))"
    return None


def _uuid_like(
    cursor: duckdb.DuckDBPyConnection, relation: str, name: str, text: str
) -> list[pa.Array]:
    """A canonical uuid the column holds, and enough bare hex to decide as on every value."""
    column = quote(name)

    def pick(condition: str, limit: int) -> pa.Array:
        query = (
            f"SELECT {column} FROM {relation} WHERE {column} IS NOT NULL AND {condition}"
            f" LIMIT {limit}"
        )
        return cursor.sql(query, params=None).to_arrow_table().column(0).combine_chunks()

    def matches(pattern: str) -> str:
        return f"regexp_matches({text}, '{pattern}')"

    canonical = pick(f"length({text}) IN (36, 38, 45) AND {matches(_RANDOM_UUID)}", 1)
    if len(canonical):
        return [canonical]
    hexed = f"length({text}) = 32 AND {matches(_HEX32)}"
    random = pick(f"{hexed} AND {matches(_RANDOM_HEX)}", _HEX_SAMPLE)
    other = pick(f"{hexed} AND NOT {matches(_RANDOM_HEX)}", 1)
    return [random, other]


_ROOT: Path | None = None


def spill_root() -> Path:
    """This process's folder for staged data and DuckDB's temporary files, removed at exit.

    A process killed before its exit leaves its folder behind: the next process to stage a
    batch removes the folders of processes that no longer run.
    """
    global _ROOT
    if _ROOT is None or not _ROOT.name.endswith(f"-{os.getpid()}"):
        base = Path(tempfile.gettempdir()) / "idem-assets"
        base.mkdir(exist_ok=True)
        _remove_orphans(base)
        _ROOT = base / f"staging-{_HOST}-{os.getpid()}"
        _ROOT.mkdir(exist_ok=True)
        atexit.register(shutil.rmtree, _ROOT, True)
    return _ROOT


#: Folders are named by host too: containers sharing a temporary directory see other hosts'
#: processes as not running.
_HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def _remove_orphans(base: Path) -> None:
    for folder in base.glob(f"staging-{_HOST}-*"):
        pid = folder.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _running(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def to_parquet(reader: pa.RecordBatchReader) -> str:
    """Drain ``reader`` into a Parquet file of this process's staging folder; its path.

    Written a batch at a time, so a window bigger than memory is handed to an input as a file
    it reads lazily (a LazyFrame, a DuckDB relation, a reader of its row groups).
    """
    import pyarrow.parquet as pq

    folder = Path(tempfile.mkdtemp(prefix="idem-input-", dir=spill_root()))
    path = str(folder / "window.parquet")
    with pq.ParquetWriter(path, reader.schema) as writer:
        for batch in reader:
            writer.write_batch(batch, row_group_size=CHUNK_ROWS)
    return path
