"""One Iceberg commit per publish: one OVERWRITE snapshot, the owner and schema in it too.

pyiceberg's own ``overwrite`` (and a transaction's ``delete`` + ``append``) records two snapshots,
a DELETE and an APPEND, so time travel "as of" a moment between them finds the window empty. Here
a single ``_OverwriteFiles`` producer drops the window's files by their partition values (no read),
rewrites only the files the window covers in part (or, for a merge, holding a key of the batch)
without those rows, and adds the batch's files: one snapshot, one metadata file, one
compare-and-swap in the catalog. Table properties (the owner) and schema changes go into the same
transaction, so they change exactly when the data does.

pyiceberg's retry is switched off for each commit (in memory, on the loaded table): its rebase
onto a concurrent writer's snapshot re-validates only the window, not the guards (a key of the
batch may have arrived in another partition meanwhile). A lost commit is reported as lost
(:func:`lost`), and the publish starts over from the guards on the new snapshot.

Private pyiceberg API: ``pyiceberg.io.pyarrow._dataframe_to_data_files`` writes Arrow as data
files of the table's spec (pyiceberg 0.12 is pinned; tests/iceberg cover it).
"""

# pyarrow.compute builds its functions at import time, so a type checker cannot see them.
# pyright: reportAttributeAccessIssue=false
import itertools
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    TableAlreadyExistsError,
    ValidationException,
)
from pyiceberg.expressions import BooleanExpression
from pyiceberg.io.pyarrow import _dataframe_to_data_files
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table import TableProperties, Transaction
from pyiceberg.table.refs import MAIN_BRANCH

from idem_assets.lib.backends.iceberg import files
from idem_assets.lib.backends.iceberg.expressions import partition_spec
from idem_assets.lib.model.windows import Region

#: The table property naming the asset that owns the table.
OWNER_PROPERTY = "idem_assets.owner"
#: Where a new table's data files go: under hashed folders, without the partition values in the
#: path. Readers take partition values from the manifests, so a category key of any length or
#: byte is stored as it is, where a ``region=<key>`` folder would outgrow a file name.
LAYOUT = {
    TableProperties.OBJECT_STORE_ENABLED: "true",
    TableProperties.WRITE_OBJECT_STORE_PARTITIONED_PATHS: "false",
}
#: Snapshot summary properties: which asset and partitions a snapshot published.
ASSET_SUMMARY, PARTITIONS_SUMMARY = "idem_assets.asset", "idem_assets.partitions"


@dataclass(frozen=True)
class Change:
    """What one publish commits: rows to add, the scope they replace, what else changes."""

    #: The rows to append, as stored (names and types of the table): in memory, or for a
    #: streamed batch its key columns only, the rows coming from :attr:`chunks`.
    batch: pa.Table
    #: The window as a row filter (``AlwaysTrue`` for the whole table) and as a region.
    scope: BooleanExpression
    region: Region
    #: A merge's key: inside the scope only the rows holding a key of the batch are replaced
    #: (empty: every row of the scope is).
    key: tuple[str, ...] = ()
    #: Table properties set by the commit (the owner).
    properties: dict[str, str] = field(default_factory=dict)
    #: The table's Arrow schema after this publish's schema changes, ``None`` for none.
    evolved: pa.Schema | None = None
    snapshot_properties: dict[str, str] = field(default_factory=dict)
    #: A streamed batch's rows, a bounded table at a time (``None``: :attr:`batch` holds them).
    chunks: Callable[[], Iterator[pa.Table]] | None = None
    #: The appended rows' columns, where :attr:`batch` holds only the keys.
    schema: pa.Schema | None = None

    def rows(self) -> Iterator[pa.Table]:
        """The rows to append, a table at a time."""
        return self.chunks() if self.chunks is not None else iter([self.batch])

    @property
    def columns(self) -> pa.Schema:
        """The appended rows' columns."""
        return self.schema if self.schema is not None else self.batch.schema


@dataclass
class Plan:
    """What a staged commit does to the table's files."""

    dropped: int = 0
    rewritten: int = 0
    kept_rows: int = 0
    added: int = 0


def without_retry(table: IcebergTable) -> IcebergTable:
    """``table`` whose next commit fails at once on a concurrent one (nothing persisted)."""
    table.metadata.properties[TableProperties.COMMIT_NUM_RETRIES] = "0"
    return table


def lost(error: BaseException) -> bool:
    """Whether ``error`` from a commit means another writer won and nothing of ours landed."""
    if isinstance(error, CommitFailedException | ValidationException | TableAlreadyExistsError):
        return True
    # A branch write whose base another commit overtook (sequence numbers are table-wide); the
    # commit was refused before the catalog saw it.
    if isinstance(error, ValueError) and "sequence number" in str(error):
        return True
    # SQLite's lock wait ran out: the compare-and-swap never ran.
    return type(error).__name__ == "OperationalError" and "database is locked" in str(error)


def stage(tx: Transaction, table: IcebergTable, change: Change, branch: str = MAIN_BRANCH) -> Plan:
    """Add the change to ``tx`` as one OVERWRITE snapshot on ``branch`` (files written now)."""
    if change.properties:
        tx.set_properties(change.properties)
    if change.evolved is not None:
        with tx.update_schema() as update:
            update.union_by_name(change.evolved)
    metadata = tx.table_metadata
    plan = Plan()
    write_id = uuid.uuid4()
    counter = itertools.count(0)
    producer = tx.update_snapshot(
        snapshot_properties=change.snapshot_properties, branch=branch
    ).overwrite(write_id)
    # The files to drop are looked up in the manifests this predicate selects.
    producer.delete_by_predicate(change.scope)
    head = metadata.refs.get(branch)
    tasks = files.plan(table, change.scope, head.snapshot_id if head else None)
    whole_inside = files.inside(metadata, change.scope)
    touches = (
        files.key_overlap(metadata.schema(), change.key[0], change.batch.column(change.key[0]))
        if change.key
        else None
    )
    rewrite = []
    for task in tasks:
        if touches is not None and not touches(task.file):
            continue
        if touches is None and files.whole(task) and whole_inside(task.file):
            producer.delete_data_file(task.file)
            plan.dropped += 1
        else:
            rewrite.append(task)
    for task in rewrite:
        current = files.read(metadata, table, [task])
        if change.key:
            kept = files.without_keys(current, change.batch, change.key)
        else:
            kept = files.outside_region(current, change.region)
        if kept.num_rows == current.num_rows:
            continue
        producer.delete_data_file(task.file)
        plan.rewritten += 1
        plan.kept_rows += kept.num_rows
        _append(producer, metadata, table, kept, write_id, counter)
    plan.added = sum(
        _append(producer, metadata, table, rows, write_id, counter) for rows in change.rows()
    )
    producer.commit()
    return plan


def _append(
    producer: object,
    metadata: object,
    table: IcebergTable,
    rows: pa.Table,
    write_id: uuid.UUID,
    counter: itertools.count,
) -> int:
    if not rows.num_rows:
        return 0
    added = 0
    for data_file in _dataframe_to_data_files(metadata, rows, table.io, write_id, counter):  # type: ignore[arg-type]
        producer.append_data_file(data_file)  # type: ignore[attr-defined]
        added += 1
    return added


def create(
    catalog: Catalog,
    identifier: tuple[str, str],
    change: Change,
    time_column: str | None,
    categories: Sequence[str],
) -> IcebergTable:
    """Create the table holding the batch, its owner and spec: one commit, one snapshot.

    A first writer that created it meanwhile makes this commit fail (lost), and the publish
    starts over on that writer's table.
    """
    schema = iceberg_schema(change.columns)
    spec = partition_spec(schema, time_column, categories)
    ensure_namespace(catalog, identifier[0])
    tx = catalog.create_table_transaction(
        identifier, schema=schema, partition_spec=spec, properties={**LAYOUT, **change.properties}
    )
    if change.chunks is None:
        if change.batch.num_rows:
            tx.append(change.batch, snapshot_properties=change.snapshot_properties)
        return tx.commit_transaction()
    # A streamed batch: its files written a chunk at a time, all added by one snapshot.
    producer = tx._append_snapshot_producer(change.snapshot_properties)  # pyright: ignore[reportPrivateUsage]
    counter = itertools.count(0)
    with producer as append:
        for rows in change.rows():
            _append(append, tx.table_metadata, tx._table, rows, append.commit_uuid, counter)  # pyright: ignore[reportPrivateUsage]
    return tx.commit_transaction()


def ensure_namespace(catalog: Catalog, namespace: str) -> None:
    """Create ``namespace`` unless it exists, also when another first writer creates it at once."""
    try:
        catalog.create_namespace_if_not_exists(namespace)
    except Exception:
        # A SQL catalog reports the other writer's row as an IntegrityError, not as the
        # namespace existing: it exists now, which is all this needs.
        if not catalog.namespace_exists(namespace):
            raise


def iceberg_schema(arrow: pa.Schema) -> Schema:
    """The Arrow schema as an Iceberg schema with ids 1..n, so a spec can name its columns."""
    # Every column optional: a later batch's NULL must not need a schema change.
    optional = pa.schema([f.with_nullable(True) for f in arrow])
    return assign_fresh_schema_ids(Catalog._convert_schema_if_needed(optional))  # pyright: ignore[reportPrivateUsage]
