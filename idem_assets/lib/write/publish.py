"""Publish one batch through any backend: every guard first, then one transaction.

The order is the contract every engine keeps: stage the batch as it will be stored, let the guards
(:mod:`idem_assets.lib.write.guards`) refuse anything unsafe, then replace or merge the window and
fingerprint it, all in one transaction. It needs no Dagster context, so benchmarks and crash tests
drive it directly.
"""

import random
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import duckdb
import pyarrow as pa

from idem_assets.lib.backends import registry
from idem_assets.lib.model.errors import ConcurrentWriteError
from idem_assets.lib.model.settings import WriteSettings
from idem_assets.lib.model.windows import (
    Cell,
    PartitionWindow,
    Region,
    WriteWindow,
    cells_for,
    region_for,
)
from idem_assets.lib.write import fitting, guards
from idem_assets.lib.write.evaluator import embedded_database
from idem_assets.lib.write.runtime_values import check_runtime_values
from idem_assets.lib.write.schema_fit import refuse_repeated_names
from idem_assets.lib.write.seam import (
    Backend,
    BatchProfile,
    Capabilities,
    CommitConflict,
    Counts,
    EngineBatch,
    Fitted,
    PartitionColumns,
    Profiles,
    Progress,
    Scope,
    Snapshot,
    Staged,
    StagesFiles,
    StagesInPlace,
    Summary,
    TableRef,
    Transaction,
    WritePlan,
    Written,
    no_progress,
    probe_of,
    values_of,
)
from idem_assets.lib.write.streams import (
    DEFAULT_MEMORY,
    SpillArea,
    Spilled,
    Stream,
    as_stream,
    memory_limited,
    spilled,
)

#: The stages a publish passes, in order; ``on_stage`` is called at each.
PUBLISH_STAGES = ("guards_passed", "deleted", "inserted", "before_commit")

#: How many times a publish whose optimistic commit lost to a concurrent writer starts over.
COMMIT_ATTEMPTS = 3

#: An ``on_stage`` hook for every publish in this context that passes none, so a test can reach
#: the publish inside an IO manager (``idem_assets.testing`` injects its crashes through it).
STAGE_HOOK: ContextVar[Callable[[str], None] | None] = ContextVar("idem_stage_hook", default=None)


@dataclass(frozen=True)
class PartitionResult:
    """What one publish changed in one partition of a range."""

    rows: int
    fingerprint: str
    inserted: int
    updated: int
    deleted: int


@dataclass(frozen=True)
class PublishResult:
    """What one publish changed, for the materialization's metadata."""

    rows: int
    inserted: int
    updated: int
    deleted: int
    partitions: list[str] = field(default_factory=list)
    fingerprint: str = ""
    table: str = ""
    #: For a range publish: each partition's own rows, fingerprint and changes.
    per_partition: dict[str, PartitionResult] = field(default_factory=dict)
    #: What the engine adds once committed (e.g. the version it committed).
    committed: dict[str, Any] = field(default_factory=dict)


def as_backend(store: duckdb.DuckDBPyConnection | Backend) -> Backend:
    """A backend for ``store``: a backend itself, or a connection an engine wraps (DuckDB's)."""
    if isinstance(store, Backend):
        return store
    if hasattr(store, "capabilities") or hasattr(store, "engine"):
        # A backend written against another protocol would otherwise be taken for a
        # connection and fail far from the cause.
        missing = [m for m in _BACKEND_MEMBERS if not hasattr(store, m)]
        raise TypeError(
            f"{type(store).__name__} is not a complete idem_assets Backend: it lacks {missing}."
            " Fix: implement them (idem_assets/lib/write/seam.py says what each does)."
        )
    return registry.wrap(store)


_BACKEND_MEMBERS = ["begin", "capabilities", "fingerprint", "load"]


def publish(
    store: duckdb.DuckDBPyConnection | Backend,
    batch: pa.Table | EngineBatch | Stream | Spilled | Any,
    settings: WriteSettings,
    window: WriteWindow | None,
    *,
    now: datetime | None = None,
    on_stage: Callable[[str], None] | None = None,
    attempts: int = COMMIT_ATTEMPTS,
    memory: str = DEFAULT_MEMORY,
    progress: Progress = no_progress,
) -> PublishResult:
    """Check ``batch`` against every guard, then replace the window with it in one transaction.

    ``store`` is a DuckDB connection or any :class:`~idem_assets.lib.write.seam.Backend`.
    Raises one of the :class:`~idem_assets.lib.model.errors.IdempotencyError` subclasses, with
    the transaction rolled back, when the write would not be safe to rerun.

    ``batch`` is a pyarrow Table, or a stream (:mod:`idem_assets.lib.write.streams`: a
    RecordBatchReader, an iterator of batches, a Polars LazyFrame, a DuckDB relation), which is
    read once into a DuckDB table held under ``memory`` and spilled to disk past it; the guards
    judge that copy and the write streams it out. ``progress`` hears how a streamed publish
    goes (rows staged, guards passed, rows written).

    ``on_stage`` is a test hook for fault and crash injection: it is called with
    ``"guards_passed"``, ``"deleted"``, ``"inserted"`` and ``"before_commit"`` as the transaction
    reaches each point, so a test can raise (or kill the process) there and prove the old
    window survives. Production callers leave it unset.
    """
    backend = as_backend(store)
    stream = batch if isinstance(batch, Spilled) else _stream_of(batch, settings)
    if stream is None:
        return _publish(backend, batch, settings, window, now, on_stage, attempts, no_progress)
    # A DuckDB relation keeps its connection busy while read: no transaction can begin there.
    if isinstance(stream, Stream) and not stream.relation and backend.capabilities.stages_in_place:
        done = _publish_in_place(backend, stream, settings, window, now, on_stage, memory, progress)
        if done is not None:
            return done
    if isinstance(stream, Stream) and not stream.relation and backend.capabilities.stages_files:
        done = _publish_files(
            backend, stream, settings, window, now, on_stage, attempts, memory, progress
        )
        if done is not None:
            return done
    with spilled(stream, spill_area(backend), memory, progress) as staged:
        return _publish(
            backend, staged.batch(), settings, window, now, on_stage, attempts, progress
        )


def _stream_of(batch: object, settings: WriteSettings) -> Stream | None:
    """``batch`` as a stream when it is one; a table or an engine's batch is not."""
    if isinstance(batch, pa.Table | EngineBatch):
        return None
    return as_stream(batch, settings.asset)


def spill_area(backend: Backend) -> SpillArea:
    """Where a streamed batch is staged for ``backend``: its own database, or the embedded one.

    An engine whose guards read the batch in its own DuckDB connection (DuckDB itself) names it
    with a ``spill_area()`` method; every other engine's guards read the embedded DuckDB.
    """
    own = getattr(backend, "spill_area", None)
    return own() if own is not None else SpillArea(embedded_database(), temporary=False)


def _publish(
    backend: Backend,
    batch: pa.Table | EngineBatch,
    settings: WriteSettings,
    window: WriteWindow | None,
    now: datetime | None,
    on_stage: Callable[[str], None] | None,
    attempts: int,
    progress: Progress,
) -> PublishResult:
    """Every attempt of one publish, until one commits, refuses, or all lost to other writers."""
    caps = backend.capabilities
    now = now or datetime.now(UTC)
    hook = on_stage or STAGE_HOOK.get() or _no_stage
    where = where_of(settings, window)
    probe = probe_of(batch)
    refuse_repeated_names(probe.column_names, where, caps.engine)
    for attempt in range(1, attempts + 1):
        try:
            with backend.begin(where) as tx:
                result = _publish_in(tx, caps, batch, settings, window, where, now, hook, progress)
            progress(f"Committed {where}: {result.table} holds {result.rows:,} rows there now.")
            return replace(result, committed=dict(tx.committed))
        except CommitConflict as exc:
            if attempt == attempts:
                raise ConcurrentWriteError(_lost_every_commit(where, attempts, exc)) from exc
            # Apart, so writers racing for one window do not collide again at once.
            time.sleep(random.uniform(0.05, 0.2) * attempt)
    raise AssertionError("unreachable: the last attempt returns or raises")


def _publish_in_place(
    backend: Backend,
    stream: Stream,
    settings: WriteSettings,
    window: WriteWindow | None,
    now: datetime | None,
    on_stage: Callable[[str], None] | None,
    memory: str,
    progress: Progress,
) -> PublishResult | None:
    """The stream staged in its table inside the one transaction; ``None``: it cannot be.

    One attempt: the stream is read once, and an engine that stages in place has no
    optimistic commit to lose.
    """
    caps = backend.capabilities
    now = now or datetime.now(UTC)
    hook = on_stage or STAGE_HOOK.get() or _no_stage
    where = where_of(settings, window)
    result = None
    try:
        with memory_limited(spill_area(backend).conn, memory), backend.begin(where) as tx:
            assert isinstance(tx, StagesInPlace), type(tx)
            staged = tx.stage_in_place(stream, settings, memory, progress)
            if staged is not None:
                batch = staged.batch()
                result = _publish_in(tx, caps, batch, settings, window, where, now, hook, progress)
    except BaseException:
        stream.cleanup()
        raise
    if result is None:
        return None
    progress(f"Committed {where}: {result.table} holds {result.rows:,} rows there now.")
    return replace(result, committed=dict(tx.committed))


def _publish_files(
    backend: Backend,
    stream: Stream,
    settings: WriteSettings,
    window: WriteWindow | None,
    now: datetime | None,
    on_stage: Callable[[str], None] | None,
    attempts: int,
    memory: str,
    progress: Progress,
) -> PublishResult | None:
    """The stream staged as the table's own files, then published; ``None``: it cannot be.

    The files outlive an attempt that lost its commit: the next one judges them again.
    """
    assert isinstance(backend, StagesFiles), type(backend)
    with memory_limited(spill_area(backend).conn, memory):
        staged = backend.stage_files(stream, settings, memory, progress)
        if staged is None:
            return None
        try:
            return _publish(
                backend, staged.batch(), settings, window, now, on_stage, attempts, progress
            )
        finally:
            staged.drop()


def _lost_every_commit(where: str, attempts: int, exc: CommitConflict) -> str:
    return (
        f"Refused to write {where}: {attempts} attempts in a row lost their commit to a"
        f" concurrent writer of the same window ({exc}). Each attempt was decided and written"
        " against a version that writer had already replaced, so none was committed: the rows"
        " are neither doubled nor lost. Nothing was changed. Fix: let one run write a partition"
        " at a time (a concurrency pool on the asset, e.g. @dg.asset(pool='warehouse'), or no"
        " overlapping backfills of the same days), then rerun the partition."
    )


def _no_stage(stage: str) -> None:
    pass


def _publish_in(
    tx: Transaction,
    caps: Capabilities,
    batch: pa.Table | EngineBatch,
    settings: WriteSettings,
    window: WriteWindow | None,
    where: str,
    now: datetime,
    on_stage: Callable[[str], None],
    progress: Progress = no_progress,
) -> PublishResult:
    """Every step of one attempt, in the contract's order; the caller's ``with`` commits."""
    scope, summary = judge(tx, caps, batch, settings, window, where, now)
    snapshot = scope.snapshot
    on_stage("guards_passed")
    progress(f"Every guard passed on the staged batch of {where}; writing it.")
    plan = WritePlan(
        scope, create=not snapshot.exists, claim=snapshot.owner is None, progress=progress
    )
    written = tx.write(plan, on_stage)
    if caps.writes_in_commit:
        progress(f"Committing {written.rows:,} rows of {where}: {caps.engine} writes them now.")
    else:
        progress(f"Wrote {written.rows:,} rows of {where}; committing.")
    if written.owner is not None:
        # A concurrent first writer of another asset may have claimed the table meanwhile.
        guards.refuse_other_owner(settings, where, written.owner, snapshot)
    guards.refuse_misplaced(scope, summary, written, caps.engine)
    on_stage("inserted")
    on_stage("before_commit")
    if caps.recheck_keys_at_commit and scope.settings.mode == "merge" and scope.pcols:
        guards.refuse_keys_elsewhere(scope, tx.summarize(scope, final=True), concurrent=True)
    return _result(scope, summary, written)


def judge(
    tx: Transaction,
    caps: Capabilities,
    batch: pa.Table | EngineBatch,
    settings: WriteSettings,
    window: WriteWindow | None,
    where: str,
    now: datetime,
) -> tuple[Scope, Summary]:
    """Describe, fit and stage the batch, then run every guard: all a publish does before writing.

    Raises the refusal the publish would raise; a plan (:mod:`idem_assets.lib.write.plan`)
    runs exactly these steps and writes nothing.
    """
    guards.refuse_unsupported_expressions(settings, caps)
    snapshot = tx.describe(settings)
    guards.refuse_foreign(settings, where, snapshot, caps.engine)
    # A batch that stays in its engine is checked on its probe here, and whole once staged.
    probe, frame = (batch.probe, batch.frame) if isinstance(batch, EngineBatch) else (batch, batch)
    fitted = fitting.fit(probe, settings, where, snapshot, caps, values_of(batch))
    staged = tx.stage(frame, fitted)
    scope = _scope(fitted, staged, snapshot, window, where)
    guards.refuse_unstorable_keys(scope, caps)
    found = _profile(tx, scope)
    if found.outside:
        guards.refuse_rounded_out(scope, found.rows)
    guards.refuse_unsafe_rows(scope, found)
    check_runtime_values(probe, settings, window, now)
    summary = tx.summarize(scope)
    guards.refuse_erasing(scope, found.rows, summary.existing)
    guards.refuse_keys_elsewhere(scope, summary)
    guards.refuse_removing_appended(scope, summary, caps.engine)
    return scope, summary


def _profile(tx: Transaction, scope: Scope) -> BatchProfile:
    """The batch's profile: the engine's own count where it has one, else the guards' scan."""
    found = tx.profile(scope) if isinstance(tx, Profiles) else None
    return found if found is not None else guards.profile(scope)


def where_of(settings: WriteSettings, window: WriteWindow | None) -> str:
    """Where a publish writes, for messages: asset 'x', partition D."""
    where = f"asset '{settings.asset}'"
    if window:
        where += f", partition {window.describe()}"
    return where


def _scope(
    fitted: Fitted,
    staged: Staged,
    snapshot: Snapshot,
    window: WriteWindow | None,
    where: str,
) -> Scope:
    """The window's bounds in the stored partition columns' types."""
    spelt = fitted.settings
    pcols: tuple[str, ...] = ()
    region: Region = ()
    cells: list[Cell] = []
    if window is not None and spelt.partition_columns:
        types = fitted.partition_types
        pcols = spelt.partition_names
        region = region_for(window, spelt.partition_columns, types)
        cells = cells_for(window, spelt.partition_columns, types)
    return Scope(
        fitted=fitted,
        staged=staged,
        snapshot=snapshot,
        window=window,
        where=where,
        pcols=pcols,
        region=region,
        cells=cells,
    )


def _result(scope: Scope, summary: Summary, written: Written) -> PublishResult:
    """What the window holds now and what changed, per partition for a range."""
    existing, matched, found = summary.existing, summary.matched, written.fingerprints
    settings = scope.settings
    updated = sum(matched.values())
    replaced = settings.mode == "overwrite" or settings.delete_missing
    deleted = sum(existing.values()) - updated if replaced else 0
    inserted = written.rows - updated
    per_partition: dict[str, PartitionResult] = {}
    if scope.cells and scope.window:
        per_partition = {
            part.key: _partition_result(
                scope.settings, found.get(part.key, (0, 0)), existing, matched, part
            )
            for part in scope.window.partitions
        }
    count = sum(n for n, _ in found.values())
    digest_sum = sum(d for _, d in found.values())
    return PublishResult(
        rows=count,
        inserted=inserted,
        updated=updated,
        deleted=deleted,
        partitions=scope.window.keys if scope.window else [],
        fingerprint=digest(count, digest_sum),
        table=scope.table_name,
        per_partition=per_partition,
    )


def _partition_result(
    settings: WriteSettings,
    stored: tuple[int, int],
    existing: Counts,
    matched: Counts,
    part: PartitionWindow,
) -> PartitionResult:
    """One partition's share of a range publish, from counts taken in its transaction."""
    rows, before, hits = stored[0], existing.get(part.key, 0), matched.get(part.key, 0)
    if settings.mode == "overwrite":
        inserted, updated, deleted = rows, 0, before
    elif settings.delete_missing:
        inserted, updated, deleted = rows - hits, hits, before - hits
    else:
        inserted, updated, deleted = rows - before, hits, 0
    return PartitionResult(rows, digest(*stored), inserted, updated, deleted)


def digest(count: int, hash_sum: int) -> str:
    """A fingerprint's text: the row count and the hash sum, folded to 128 bits."""
    return f"{count}:{int(hash_sum) % (1 << 128):032x}"


def table_fingerprint(
    store: duckdb.DuckDBPyConnection | Backend,
    schema: str,
    table: str,
    partition_columns: PartitionColumns = None,
    window: WriteWindow | None = None,
) -> str | None:
    """Fingerprint a table (or one window of it); ``None`` when the table does not exist.

    ``partition_columns`` is the asset's ``partition_expr``: a column, or a dict per dimension.
    """
    found = as_backend(store).fingerprint(TableRef(schema, table), partition_columns, window)
    return None if found is None else digest(*found)
