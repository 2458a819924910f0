"""A lock per table that works on any Hive metastore: a partition only one writer can add.

A metastore keeps a partition's spec unique, so adding partition ``(name = 'db.t')`` to
``idem_meta.locks`` succeeds for exactly one writer; the others wait until it is dropped. The
lock is held only for a publish's commit (a few metastore calls), never while Spark computes.
A writer killed while holding it leaves it behind: a lock older than :data:`LEASE_S` is taken
over (the metastore's own clock dates it).
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager

from py4j.protocol import Py4JJavaError
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from idem_assets.lib.backends.spark import catalog

DATABASE = "idem_meta"
TABLE = "locks"
#: How long a commit waits for another's lock before it gives up.
WAIT_S = 120.0
#: A lock this old belongs to a writer that died: commits hold it for seconds.
LEASE_S = 60.0


def _ensure(spark: SparkSession) -> None:
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
    try:
        spark.sql(
            f"CREATE TABLE IF NOT EXISTS {DATABASE}.{TABLE} (holder STRING, name STRING)"
            " USING parquet PARTITIONED BY (name)"
        )
    except AnalysisException as exc:
        # Another writer created it between the check and the creation.
        if "ALREADY_EXISTS" not in str(exc):
            raise


#: What the catalog raises: through SQL, or through its API (the Java exception's text).
_CATALOG_ERRORS = (AnalysisException, Py4JJavaError)


@contextmanager
def table_lock(spark: SparkSession, name: str) -> Iterator[None]:
    """Hold the lock of table ``name`` (``db.table``) for the body.

    The lock's partition is added and dropped through the catalog's API: one metastore call
    each, without a statement's parsing, refresh and statistics.
    """
    spec = {"name": name}
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            catalog.add_partitions(spark, DATABASE, TABLE, {(("name", name),): None})
            break
        except _CATALOG_ERRORS as exc:
            if "NOT_FOUND" in str(exc) or "NoSuchTable" in str(exc):
                # The first commit on this metastore: the locks' table is made once.
                _ensure(spark)
                continue
            if _contended(exc) and time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            if not _taken(exc) or time.monotonic() > deadline:
                raise
        try:
            created = catalog.partition_created(spark, DATABASE, TABLE, spec)
        except _CATALOG_ERRORS as exc:
            if not _contended(exc):
                raise
            created = None
        if created is not None and time.time() - created > LEASE_S:
            catalog.drop_partition(spark, DATABASE, TABLE, spec, keep_directory=True)
            continue
        time.sleep(0.1)
    try:
        yield
    finally:
        _release(spark, spec)


def _taken(exc: Exception) -> bool:
    """Whether adding the lock failed because another writer holds it."""
    text = str(exc)
    return "ALREADY_EXIST" in text or "AlreadyExist" in text


def _contended(exc: Exception) -> bool:
    """Whether the metastore's own database refused a statement for a concurrent one.

    Derby, a metastore's database in tests, reports two writers of the locks' table as a
    deadlock and rolls one back, and a lock read while its holder drops it as a missing row
    ("No such database row"): that writer tries again.
    """
    text = str(exc)
    return any(
        found in text
        for found in ("deadlock", "lock could not be obtained", "No such database row")
    )


def _release(spark: SparkSession, spec: dict[str, str], attempts: int = 20) -> None:
    for attempt in range(attempts):
        try:
            # The directory stays: a writer adding the lock meanwhile creates it, and would
            # fail setting its permissions if it were deleted under it.
            catalog.drop_partition(spark, DATABASE, TABLE, spec, keep_directory=True)
            return
        except _CATALOG_ERRORS as exc:
            if not _contended(exc) or attempt == attempts - 1:
                raise
            time.sleep(0.1)
