"""Spark's catalog and file system through its JVM: partition locations, one-call swaps, files.

SQL can move one partition at a time (``ALTER TABLE ... PARTITION ... SET LOCATION``); the
window's partitions move together only through the catalog's ``alterPartitions``, which a Hive
metastore runs as one ``alter_partitions`` transaction. That API is Spark's own, not public, so
the ``spark`` extra pins Spark's minor version and this module is the only one that uses it.
"""

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from py4j.java_gateway import JavaClass
from pyspark.sql import SparkSession
from pyspark.sql import types as T

#: A partition as the catalog names it: ``(column, value)`` pairs in the table's column order.
Spec = tuple[tuple[str, str], ...]


def _catalog(spark: SparkSession) -> Any:
    return spark._jsparkSession.sessionState().catalog()  # type: ignore[union-attr]


def _external(spark: SparkSession, db: str, table: str) -> tuple[Any, str, str]:
    """The metastore's catalog, and ``db.table`` spelled as the session's catalog spells it.

    The session's catalog checks the database and the table before every call, and reads the
    table again for a partition call: a metastore round trip each, which cost a commit more
    than its own calls. The calls here name the table exactly, so they go straight to the
    metastore (through Spark's wrapper that posts catalog events), with the names formatted
    as the session's catalog would (lower case unless ``spark.sql.caseSensitive``).
    """
    qualified = _catalog(spark).qualifyIdentifier(_ident(spark, db, table))
    external = spark._jsparkSession.sharedState().externalCatalog()  # type: ignore[union-attr]
    return external, str(qualified.database().get()), str(qualified.table())


def _class(spark: SparkSession, name: str) -> Any:
    """A JVM class by its full name (py4j's ``jvm.a.b.C`` asks the JVM about each part)."""
    return JavaClass(name, spark.sparkContext._gateway._gateway_client)  # type: ignore[union-attr]


def _ident(spark: SparkSession, db: str, table: str) -> Any:
    return _class(spark, "org.apache.spark.sql.catalyst.TableIdentifier").apply(
        table, _class(spark, "scala.Option").apply(db)
    )


def _scala_map(spark: SparkSession, items: Mapping[str, str]) -> Any:
    found = _class(spark, "java.util.HashMap")()
    for k, v in items.items():
        found.put(k, v)
    # Scala 2.13's immutable.Map.from; "from" is a Python keyword.
    return getattr(_class(spark, "scala.collection.immutable.Map"), "from")(
        _class(spark, "scala.jdk.javaapi.CollectionConverters").asScala(found)
    )


def _scala_list(spark: SparkSession, items: Sequence[Any]) -> Any:
    found = _class(spark, "java.util.ArrayList")()
    for item in items:
        found.add(item)
    return _class(spark, "scala.jdk.javaapi.CollectionConverters").asScala(found).toList()


def _json(spark: SparkSession, scala: Any) -> Any:
    """A Scala collection of strings as Python data, in one round trip to the JVM, not one each."""
    java = _class(spark, "scala.jdk.javaapi.CollectionConverters").asJava(scala)
    return json.loads(
        _class(spark, "com.fasterxml.jackson.databind.ObjectMapper")().writeValueAsString(java)
    )


def _as_dict(spark: SparkSession, scala_map: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in _json(spark, scala_map).items()}


def table_info(
    spark: SparkSession, db: str, table: str
) -> tuple[str, tuple[str, ...], dict[str, str], T.StructType] | None:
    """The table's location, partition columns, properties and schema; ``None``: no table."""
    external, db, table = _external(spark, db, table)
    if not external.tableExists(db, table):
        return None
    meta = external.getTable(db, table)
    # As the session's catalog reads it: CHAR and VARCHAR columns hold strings.
    chars = _class(spark, "org.apache.spark.sql.catalyst.util.CharVarcharUtils")
    return (
        str(meta.location().toString()),
        tuple(str(n) for n in _json(spark, meta.partitionColumnNames())),
        _as_dict(spark, meta.properties()),
        T.StructType.fromJson(
            json.loads(chars.replaceCharVarcharWithStringInSchema(meta.schema()).json())
        ),
    )


def table_exists(spark: SparkSession, db: str, table: str) -> bool:
    """Whether the catalog holds the table (without an error logged when it does not)."""
    return bool(_catalog(spark).tableExists(_ident(spark, db, table)))


def _copied(case: Any, **changes: Any) -> Any:
    """A copy of a Scala case class with the named fields changed."""
    fields = []
    for i in range(case.productArity()):
        name = str(case.productElementName(i))
        fields.append(changes.pop(name) if name in changes else case.productElement(i))
    assert not changes, f"no such fields: {sorted(changes)}"
    return case.copy(*fields)


def advance(
    spark: SparkSession, db: str, table: str, counter: str, seen: int, values: Mapping[str, str]
) -> int:
    """Raise the table's commit counter from ``seen``, setting ``values`` with it; or not.

    Returns the counter the table held: any other than ``seen`` means nothing was changed.
    One read and one write of the table's metadata, as ``ALTER TABLE ... SET TBLPROPERTIES``
    without the statement's parsing and analysis, which cost more than the calls.
    """
    external, db, table = _external(spark, db, table)
    meta = external.getTable(db, table)
    found = meta.properties().get(counter)
    now = int(found.get()) if found.isDefined() else 0
    if now != seen:
        return now
    changed = {**values, counter: str(seen + 1)}
    properties = getattr(meta.properties(), "$plus$plus")(_scala_map(spark, changed))
    external.alterTable(_copied(meta, properties=properties))
    return now


def add_partitions(
    spark: SparkSession,
    db: str,
    table: str,
    specs: Mapping[Spec, str | None],
    if_missing: bool = False,
) -> None:
    """Register partitions in one metastore call (a location ``None``: the table's default).

    ``if_missing``: a partition that exists already is left as it is; otherwise it fails the
    call, and no partition is added.
    """
    catalog = _catalog(spark)
    formats = _class(spark, "org.apache.spark.sql.catalyst.catalog.CatalogStorageFormat")
    now = _class(spark, "java.lang.System").currentTimeMillis()
    parts = []
    for spec, location in specs.items():
        storage = formats.empty()
        if location is not None:
            uri = _class(spark, "scala.Option").apply(_class(spark, "java.net.URI")(location))
            storage = _copied(storage, locationUri=uri)
        parts.append(
            _class(spark, "org.apache.spark.sql.catalyst.catalog.CatalogTablePartition")(
                _scala_map(spark, dict(spec)),
                storage,
                _scala_map(spark, {}),
                now,
                0,
                _class(spark, "scala.Option").empty(),
            )
        )
    catalog.createPartitions(_ident(spark, db, table), _scala_list(spark, parts), if_missing)


def drop_partition(
    spark: SparkSession, db: str, table: str, spec: Mapping[str, str], keep_directory: bool = False
) -> None:
    """Drop a partition and its directory in one metastore call; a missing one is no error.

    ``keep_directory``: the partition's directory stays, for the next partition of that spec.
    """
    specs = _scala_list(spark, [_scala_map(spark, spec)])
    _catalog(spark).dropPartitions(_ident(spark, db, table), specs, True, False, keep_directory)


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "%" and i + 2 < len(text) + 0 and _is_hex(text[i + 1 : i + 3]):
            out.append(chr(int(text[i + 1 : i + 3], 16)))
            i += 3
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _is_hex(text: str) -> bool:
    return len(text) == 2 and all(c in "0123456789abcdefABCDEF" for c in text)


def written_partitions(spark: SparkSession, location: str, layout: Sequence[str]) -> list[Spec]:
    """The partitions a write left in ``location``, read from its directory names."""
    fs, path = _path(spark, location)
    pattern = _class(spark, "org.apache.hadoop.fs.Path")(location + "/*" * len(layout))
    found = fs.globStatus(pattern) if fs.exists(path) else None
    specs: list[Spec] = []
    for status in found or []:
        if not status.isDirectory():
            continue
        parts = str(status.getPath().toString()).rstrip("/").split("/")[-len(layout) :]
        pairs = [p.split("=", 1) for p in parts]
        if all(len(p) == 2 for p in pairs):
            specs.append(tuple(sorted((_unescape(k).lower(), _unescape(v)) for k, v in pairs)))
    return specs


@dataclass(frozen=True)
class Partition:
    """A partition as the metastore listed it: its location, and the catalog's own record."""

    location: str
    #: The catalog's ``CatalogTablePartition``: a swap changes its copy, not read again.
    record: Any = field(compare=False)


def partitions(spark: SparkSession, db: str, table: str) -> dict[Spec, Partition]:
    """Every partition of the table with its location, read from the metastore now."""
    found: dict[Spec, Partition] = {}
    listed = _catalog(spark).listPartitions(
        _ident(spark, db, table), _class(spark, "scala.Option").empty()
    )
    for i in range(listed.size()):
        part = listed.apply(i)
        spec = _as_dict(spark, part.spec())
        location = str(part.storage().locationUri().get().toString())
        found[tuple(sorted((k.lower(), v) for k, v in spec.items()))] = Partition(location, part)
    return found


#: Statistics of a partition's files, which describe the replaced directory after a swap.
_STATISTICS = ("totalSize", "numFiles", "numRows", "rawDataSize")


def move_partitions(
    spark: SparkSession,
    db: str,
    table: str,
    moves: Mapping[Spec, str],
    listed: Mapping[Spec, Partition] | None = None,
) -> None:
    """Point every partition in ``moves`` at its new location in one catalog call.

    ``listed``: the partitions as read before (under the table's lock, unchanged since, as
    its commit counter shows); the others are read now.
    """
    external, db, table = _external(spark, db, table)
    moved = []
    for spec, location in moves.items():
        known = (listed or {}).get(spec)
        part = (
            known.record
            if known
            else external.getPartition(db, table, _scala_map(spark, dict(spec)))
        )
        uri = _class(spark, "scala.Option").apply(_class(spark, "java.net.URI")(location))
        params = _as_dict(spark, part.parameters())
        kept = {k: v for k, v in params.items() if k not in _STATISTICS}
        moved.append(
            _copied(
                part,
                storage=_copied(part.storage(), locationUri=uri),
                parameters=_scala_map(spark, kept),
                stats=_class(spark, "scala.Option").empty(),
            )
        )
    # Every location is absolute (under the table's root): nothing for the session to qualify.
    external.alterPartitions(db, table, _scala_list(spark, moved))


def _path(spark: SparkSession, location: str) -> tuple[Any, Any]:
    path = _class(spark, "org.apache.hadoop.fs.Path")(location)
    conf = spark._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    return path.getFileSystem(conf), path


def make_directory(spark: SparkSession, location: str) -> None:
    """Create ``location`` (and its parents) on the table's file system."""
    fs, path = _path(spark, location)
    fs.mkdirs(path)


def exists(spark: SparkSession, location: str) -> bool:
    """Whether ``location`` exists."""
    fs, path = _path(spark, location)
    return bool(fs.exists(path))


def remove(spark: SparkSession, location: str) -> None:
    """Delete ``location`` and everything under it; a missing one is no error."""
    fs, path = _path(spark, location)
    try:
        fs.delete(path, True)
    except Exception:
        pass


def _hidden(name: str) -> bool:
    """Whether Spark's file listing skips a file of this name (``InMemoryFileIndex``)."""
    return (
        (name.startswith("_") and "=" not in name)
        or name.startswith(".")
        or (name.endswith("._COPYING_"))
    )


#: More files than this are counted by a Spark job: footers are read one at a time.
FOOTERS_READ = 64


def row_count(spark: SparkSession, locations: Sequence[str]) -> int | None:
    """The rows of the Parquet files in ``locations``, from their footers (no row is read).

    ``None`` where Spark would read something else there (a directory, a summary file, a
    file that is no Parquet) or there are more than :data:`FOOTERS_READ` files.
    """
    conf = spark._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    files = []
    for location in locations:
        fs, path = _path(spark, location)
        if not fs.exists(path):
            continue
        for status in fs.listStatus(path):
            name = str(status.getPath().getName())
            if name.startswith(("_metadata", "_common_metadata")):
                return None
            if _hidden(name):
                continue
            if status.isDirectory():
                return None
            files.append(status)
    if len(files) > FOOTERS_READ:
        return None
    total = 0
    for status in files:
        try:
            reader = _class(spark, "org.apache.parquet.hadoop.ParquetFileReader").open(
                _class(spark, "org.apache.parquet.hadoop.util.HadoopInputFile").fromStatus(
                    status, conf
                )
            )
        except Exception:
            return None
        try:
            total += int(reader.getRecordCount())
        finally:
            reader.close()
    return total


def move_files(spark: SparkSession, source: str, target: str) -> list[str]:
    """Move every file under ``source`` to the same place under ``target``; returns them there.

    A rename of each file (a copy on object storage): the files keep their names, which
    hold the id of the job that wrote them, so they join a directory without clashing.
    """
    fs, path = _path(spark, source)
    root = str(fs.makeQualified(path).toString()).rstrip("/")
    moved = []
    if not fs.exists(path):
        return moved
    found = fs.listFiles(path, True)
    files = []
    while found.hasNext():
        files.append(str(found.next().getPath().toString()))
    for name in files:
        relative = name[len(root) :].lstrip("/")
        if any(_hidden(part) for part in relative.split("/")):
            continue
        destination = _class(spark, "org.apache.hadoop.fs.Path")(f"{target.rstrip('/')}/{relative}")
        fs.mkdirs(destination.getParent())
        if not fs.rename(_class(spark, "org.apache.hadoop.fs.Path")(name), destination):
            raise OSError(f"could not move {name} to {destination.toString()}")
        moved.append(str(destination.toString()))
    return moved


def qualified(spark: SparkSession, location: str) -> str:
    """``location`` as a full URI of its file system (``file:/...`` for a local path)."""
    fs, path = _path(spark, location)
    return str(fs.makeQualified(path).toString())


def partition_created(
    spark: SparkSession, db: str, table: str, spec: Mapping[str, str]
) -> float | None:
    """When a partition was added (seconds since the epoch), ``None`` if it is gone."""
    external = spark._jsparkSession.sharedState().externalCatalog()  # type: ignore[union-attr]
    found = external.getPartitionOption(db, table, _scala_map(spark, spec))
    if not found.isDefined():
        return None
    return float(found.get().createTime()) / 1000
