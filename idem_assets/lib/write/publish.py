"""Publish one batch through any backend: every guard first, then one transaction.

The order is the contract every engine keeps: stage the batch as it will be stored, let the
guards (:mod:`idem_assets.lib.write.guards`) refuse anything unsafe, then replace or merge the window
and fingerprint it, all in one transaction. It needs no Dagster context, so benchmarks and crash
tests drive it directly.
"""

import random
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime

import duckdb
import pyarrow as pa

from idem_assets.lib.backends.duckdb.backend import DuckDBBackend
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
from idem_assets.lib.write import guards
from idem_assets.lib.write.runtime_values import check_runtime_values
from idem_assets.lib.write.schema_fit import refuse_repeated_names
from idem_assets.lib.write.seam import (
    AppendOnlyTables,
    Backend,
    ChecksKeysAtCommit,
    CommitConflict,
    Counts,
    HandsOver,
    KeysInPaths,
    PartitionColumns,
    Scope,
    Target,
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


def as_backend(store: duckdb.DuckDBPyConnection | Backend) -> Backend:
    """A backend for ``store``: anything else (a DuckDB connection) gets the DuckDB backend."""
    if isinstance(store, Backend):
        return store
    if hasattr(store, "engine"):
        # A backend written against an older protocol would otherwise be taken for a DuckDB
        # connection and fail far from the cause.
        missing = [m for m in _BACKEND_MEMBERS if not hasattr(store, m)]
        raise TypeError(
            f"{type(store).__name__} is not a complete idem_assets Backend: it lacks {missing}."
            " Fix: implement them (idem_assets/lib/write/seam.py says what each does)."
        )
    # Not isinstance(DuckDBPyConnection): wrapped connections (cursors, proxies) count too.
    return DuckDBBackend(store)  # type: ignore[arg-type]


_BACKEND_MEMBERS = sorted(
    name for name in vars(Backend) if not name.startswith("_") and callable(vars(Backend)[name])
)


def publish(
    store: duckdb.DuckDBPyConnection | Backend,
    batch: pa.Table,
    settings: WriteSettings,
    window: WriteWindow | None,
    *,
    now: datetime | None = None,
    on_stage: Callable[[str], None] | None = None,
    attempts: int = COMMIT_ATTEMPTS,
) -> PublishResult:
    """Check ``batch`` against every guard, then replace the window with it in one transaction.

    ``store`` is a DuckDB connection or any :class:`~idem_assets.lib.backends.protocol.Backend`.
    Raises one of the :class:`~idem_assets.lib.errors.IdempotencyError` subclasses, with the
    transaction rolled back, when the write would not be safe to rerun.

    ``on_stage`` is a test hook for fault and crash injection: it is called with
    ``"guards_passed"``, ``"deleted"``, ``"inserted"`` and ``"before_commit"`` as the transaction
    reaches each point, so a test can raise (or kill the process) there and prove the old
    window survives. Production callers leave it unset.
    """
    backend = as_backend(store)
    now = now or datetime.now(UTC)
    hook = on_stage or STAGE_HOOK.get() or _no_stage
    where = f"asset '{settings.asset}'"
    if window:
        where += f", partition {window.describe()}"
    refuse_repeated_names(batch.column_names, where, backend.engine)
    for attempt in range(1, attempts + 1):
        try:
            with backend.transaction(where):
                result, scope = _publish_in_transaction(
                    backend, batch, settings, window, where, now, hook
                )
                hook("before_commit")
                _refuse_keys_stored_meanwhile(backend, scope)
            return result
        except CommitConflict as exc:
            if attempt == attempts:
                raise ConcurrentWriteError(_lost_every_commit(where, attempts, exc)) from exc
            # Apart, so writers racing for one window do not collide again at once.
            time.sleep(random.uniform(0.05, 0.2) * attempt)
    raise AssertionError("unreachable: the last attempt returns or raises")


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


def _refuse_keys_stored_meanwhile(backend: Backend, scope: Scope) -> None:
    """Refuse a merge whose keys a concurrent writer stored in another partition meanwhile."""
    if scope.settings.mode != "merge" or not scope.pcols:
        return
    if not isinstance(backend, ChecksKeysAtCommit):
        return
    elsewhere = backend.keys_elsewhere_at_commit(scope)
    if elsewhere:
        sample = backend.keys_elsewhere_sample(scope)
        guards.refuse_keys_elsewhere(scope, elsewhere, sample, concurrent=True)


def _publish_in_transaction(
    backend: Backend,
    batch: pa.Table,
    settings: WriteSettings,
    window: WriteWindow | None,
    where: str,
    now: datetime,
    on_stage: Callable[[str], None],
) -> tuple[PublishResult, Scope]:
    target = backend.describe(settings)
    handover = backend.handover_text(settings) if isinstance(backend, HandsOver) else None
    if target.owner is not None:
        guards.refuse_other_owner(settings, where, target.owner, backend.owners_text(), handover)
    elif target.exists and not target.claimable:
        guards.refuse_unclaimed(settings, where, backend.engine, handover or "")
    scope = _scope(backend, batch, settings, window, where, target)
    if isinstance(backend, KeysInPaths):
        paths = backend.key_paths(scope)
        guards.refuse_unstorable_keys(scope, paths, backend.name_limit, backend.engine)
    evaluator = backend.evaluator()
    found = guards.profile(evaluator, scope)
    if found.outside:
        guards.refuse_rounded_out(evaluator, scope, found.rows)
    guards.refuse_unsafe_rows(evaluator, scope, found)
    check_runtime_values(batch, settings, window, now)
    existing = backend.count_window(scope)
    guards.refuse_erasing(evaluator, scope, found.rows, existing)
    matched, elsewhere = backend.count_keys(scope)
    if elsewhere and scope.pcols:
        guards.refuse_keys_elsewhere(scope, elsewhere, backend.keys_elsewhere_sample(scope))
    if target.append_only and isinstance(backend, AppendOnlyTables):
        lift = backend.lift_append_only_text(settings)
        guards.refuse_removing_appended(scope, existing, matched, backend.engine, lift)

    on_stage("guards_passed")
    if target.owner is None:
        backend.claim(settings)
    if scope.staged.changes:
        backend.evolve(scope.settings, scope.staged.changes)
    if scope.settings.mode == "merge":
        written = backend.merge(scope, on_stage)
    else:
        written = backend.replace(scope, on_stage)
    on_stage("inserted")
    updated = sum(matched.values())
    replaced = scope.settings.mode == "overwrite" or scope.settings.delete_missing
    deleted = sum(existing.values()) - updated if replaced else 0
    return _result(backend, scope, written - updated, updated, deleted, existing, matched), scope


def _scope(
    backend: Backend,
    batch: pa.Table,
    settings: WriteSettings,
    window: WriteWindow | None,
    where: str,
    target: Target,
) -> Scope:
    """Stage the batch and work out the window's bounds in the stored partition column's type."""
    staged = backend.stage(batch, settings, where)
    spelt = staged.settings
    pcols: tuple[str, ...] = ()
    region: Region = ()
    cells: list[Cell] = []
    if window is not None and spelt.partition_columns:
        types = staged.partition_types
        pcols = spelt.partition_names
        region = region_for(window, spelt.partition_columns, types)
        cells = cells_for(window, spelt.partition_columns, types)
    return Scope(
        settings=spelt,
        window=window,
        where=where,
        staged=staged,
        table_exists=target.exists,
        pcols=pcols,
        region=region,
        cells=cells,
    )


def _result(
    backend: Backend,
    scope: Scope,
    inserted: int,
    updated: int,
    deleted: int,
    existing: Counts,
    matched: Counts,
) -> PublishResult:
    """Fingerprint what the window holds now, per partition for a range."""
    found = backend.fingerprints(scope)
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
    found = as_backend(store).fingerprint_table(schema, table, partition_columns, window)
    return None if found is None else digest(*found)
