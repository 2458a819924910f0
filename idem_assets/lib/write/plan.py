"""Plan a publish: every step of one up to its write, then what the write would change.

:func:`plan` opens the publish's transaction, describes, fits and stages the batch and runs every
guard (:func:`~idem_assets.lib.write.publish.judge`), exactly as :func:`~idem_assets.lib.write.
publish.publish` does; then, instead of writing, it compares the staged batch with the window as
stored, and rolls the transaction back. One DuckDB statement serves every engine, run where both
sides already are (:func:`_sides`): the engine only stages and loads, as it does for a publish.

The counts are of rows *changed*, not rows written: an overwrite writes the whole window, but
a rerun that reproduces it changes nothing. An overwrite compares rows by their whole content
(a changed row is one deleted and one inserted); a merge compares by key (a key the window
holds whose row differs is updated). The fingerprints are the publish's
(:func:`~idem_assets.lib.write.publish.digest`): the planned one is the fingerprint the publish
would record.
"""

import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import duckdb
import pyarrow as pa

from idem_assets.lib.model.errors import ConcurrentWriteError, IdempotencyError
from idem_assets.lib.model.settings import WriteMode, WriteSettings
from idem_assets.lib.model.windows import Region, WriteWindow
from idem_assets.lib.sql import statements
from idem_assets.lib.write.evaluator import DuckDBEvaluator, embedded
from idem_assets.lib.write.publish import (
    COMMIT_ATTEMPTS,
    as_backend,
    digest,
    judge,
    spill_area,
    where_of,
)
from idem_assets.lib.write.schema_fit import refuse_repeated_names
from idem_assets.lib.write.seam import (
    Backend,
    CommitConflict,
    EngineBatch,
    Scope,
    TableRef,
    probe_of,
)
from idem_assets.lib.write.streams import DEFAULT_MEMORY, Spilled, Stream, as_stream, spilled


@dataclass(frozen=True)
class PartitionPlan:
    """What a publish would change in one partition (or in the whole window)."""

    rows_before: int = 0
    rows_after: int = 0
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    #: ``None`` without a table.
    fingerprint_before: str | None = None
    fingerprint_after: str | None = None

    @property
    def changed(self) -> bool:
        """Whether the publish would change any row."""
        return bool(self.inserted or self.updated or self.deleted)


@dataclass(frozen=True)
class PublishPlan:
    """What :func:`~idem_assets.lib.write.publish.publish` would do with a batch; nothing done."""

    asset: str
    table: str
    mode: WriteMode
    #: The run's partition keys (empty when unpartitioned).
    partitions: list[str]
    #: The whole window's counts and fingerprints.
    total: PartitionPlan
    #: For a range: each partition's own.
    per_partition: dict[str, PartitionPlan] = field(default_factory=dict)
    #: The refusal the publish would raise ("" when it would publish), and its class.
    refusal: str = ""
    refused_by: str = ""
    #: With ``keep_rows``: the window's rows as the publish would leave them (stored names).
    rows: pa.Table | None = None

    @property
    def refused(self) -> bool:
        """Whether the publish would be refused (and so change nothing)."""
        return bool(self.refusal)

    def partition(self, key: str | None) -> PartitionPlan:
        """One partition's plan: its own in a range, the window's for one partition."""
        if key is not None and key in self.per_partition:
            return self.per_partition[key]
        return self.total


class _Planned(Exception):
    """Leaves the publish's transaction so it rolls back, carrying the plan out."""

    def __init__(self, plan: PublishPlan) -> None:
        super().__init__("planned")
        self.plan = plan


def plan(
    store: duckdb.DuckDBPyConnection | Backend,
    batch: "pa.Table | EngineBatch | Stream | Spilled | Any",
    settings: WriteSettings,
    window: WriteWindow | None,
    *,
    now: datetime | None = None,
    refusal: IdempotencyError | None = None,
    keep_rows: bool = False,
    attempts: int = COMMIT_ATTEMPTS,
    memory: str = DEFAULT_MEMORY,
) -> PublishPlan:
    """What publishing ``batch`` would change, with every guard run; nothing is written.

    A batch the publish would refuse plans to no change, with the refusal's message: a plan
    reports it instead of raising. ``refusal`` is one decided before the publish (a blocking
    check): the batch is then not staged at all. ``keep_rows``: the plan holds the window's
    rows as the publish would leave them, for the plans of assets downstream.
    """
    backend = as_backend(store)
    now = now or datetime.now(UTC)
    where = where_of(settings, window)
    if refusal is not None:
        return _refused(backend, settings, window, refusal)
    stream = batch if isinstance(batch, Spilled) else as_stream(batch, settings.asset)
    if stream is not None and not isinstance(batch, pa.Table | EngineBatch):
        # Staged once, as the publish stages it; the plan then judges that copy.
        with spilled(stream, spill_area(backend), memory) as staged:
            return plan(
                backend,
                staged.batch(),
                settings,
                window,
                now=now,
                keep_rows=keep_rows,
                attempts=attempts,
            )
    for attempt in range(1, attempts + 1):
        try:
            refuse_repeated_names(probe_of(batch).column_names, where, backend.capabilities.engine)
            with backend.begin(where) as tx:
                scope, _ = judge(tx, backend.capabilities, batch, settings, window, where, now)
                raise _Planned(_compared(backend, scope, keep_rows))
        except _Planned as planned:
            return planned.plan
        except IdempotencyError as exc:
            return _refused(backend, settings, window, exc)
        except CommitConflict as exc:
            if attempt == attempts:
                return _refused(backend, settings, window, ConcurrentWriteError(str(exc)))
            time.sleep(random.uniform(0.05, 0.2) * attempt)
    raise AssertionError("unreachable: the last attempt returns")


def _compared(backend: Backend, scope: Scope, keep_rows: bool) -> PublishPlan:
    """The staged batch against the window as stored, in one DuckDB statement."""
    settings = scope.settings
    names = [c.stored_name for c in scope.fitted.columns]
    key = scope.key if settings.mode == "merge" else []
    # The write keeps the latest row per key; the plan compares what it would keep.
    order_by = settings.dedupe_order_by if key else ()
    rows = None
    with _sides(backend, scope, names) as sides:

        def diff(pairs: bool) -> list[tuple[Any, ...]]:
            return sides.evaluator.rows(
                statements.plan_diff(
                    sides.after,
                    sides.before,
                    names,
                    key,
                    scope.cells,
                    settings.delete_missing,
                    sides.region,
                    sides.missing,
                    order_by,
                    pairs,
                )
            )

        found = diff(pairs=False)
        if not all(row[-1] for row in found):
            # A row repeats in the batch and in the window: only counting pairs is exact.
            found = diff(pairs=True)
        if keep_rows:
            rows = sides.evaluator.arrow(
                statements.planned_rows(
                    sides.after,
                    sides.before,
                    names,
                    key,
                    not settings.delete_missing,
                    sides.region,
                    sides.missing,
                    order_by,
                )
            )
    exists = scope.table_exists
    # (rows_before, hash_before, rows_after, hash_after, inserted, updated, deleted, unchanged)
    counted = {row[0]: tuple(int(v) for v in row[1:-1]) for row in found}
    keys = scope.window.keys if scope.window else []
    nothing = (0,) * 8
    per_partition: dict[str, PartitionPlan] = {}
    if scope.cells:
        sums = [counted.get(k, nothing) for k in keys]
        per_partition = {k: _partition_plan(c, exists) for k, c in zip(keys, sums, strict=True)}
        whole = tuple(sum(column) for column in zip(nothing, *sums, strict=True))
    else:
        whole = counted.get(None, nothing)
    total = _partition_plan(whole, exists)
    if not backend.capabilities.plan_predicts_fingerprints:
        total, per_partition = _engine_fingerprints(backend, scope, total, per_partition)
    return PublishPlan(
        asset=settings.asset,
        table=scope.table_name,
        mode=settings.mode,
        partitions=keys,
        total=total,
        per_partition=per_partition,
        rows=rows,
    )


@dataclass(frozen=True)
class _Sides:
    """Where a plan compares: an evaluator that reads the staged batch and the stored window."""

    evaluator: DuckDBEvaluator
    #: The staged batch and the stored rows, as the statements take relations.
    after: str
    before: statements.Rel
    #: The window's rows in ``before`` (empty: every row of it is the window's).
    region: Region
    #: The batch's columns the stored rows lack (the publish adds them): NULL in them.
    missing: tuple[str, ...]


@contextmanager
def _sides(backend: Backend, scope: Scope, names: list[str]) -> Iterator[_Sides]:
    """The two sides of a plan, copied only where they do not live in one DuckDB already.

    Where the staged batch's evaluator reads the target table (DuckDB's one connection), the
    window is read in place; an engine staging in the embedded DuckDB loads its window into that
    evaluator beside the staged batch; only a batch staged elsewhere (Spark) crosses as Arrow.
    """
    staged, settings = scope.staged, scope.settings
    evaluator = staged.evaluator
    if (
        isinstance(evaluator, DuckDBEvaluator)
        and backend.capabilities.evaluator_reads_target
        and scope.snapshot.columns is not None
    ):
        stored = scope.snapshot.columns
        missing = tuple(n for n in names if n not in stored)
        target = (settings.schema, settings.table)
        yield _Sides(evaluator, _name(staged.relation), target, scope.region, missing)
        return
    own = None
    after = staged.relation
    if not isinstance(evaluator, DuckDBEvaluator):
        own = evaluator = embedded()
        after = evaluator.register(staged.evaluator.arrow(f"SELECT * FROM {staged.relation}"))
    try:
        loaded = backend.load(settings, scope.window) if scope.table_exists else None
        assert loaded is None or isinstance(loaded, pa.Table)
        if loaded is None:
            loaded = evaluator.arrow(f"SELECT * FROM {after} LIMIT 0")
        before = evaluator.register(loaded)
        missing = tuple(n for n in names if n not in loaded.column_names)
        yield _Sides(evaluator, _name(after), _name(before), (), missing)
    finally:
        if own is not None:
            own.release()
            own.conn.close()


def _name(relation: str) -> str:
    """A relation's name as the statements take it (registered names come quoted)."""
    return relation[1:-1].replace('""', '"') if relation.startswith('"') else relation


def _partition_plan(sums: tuple[int, ...], exists: bool) -> PartitionPlan:
    """A partition's plan from its counts and hash sums (no table: no fingerprint before)."""
    rows_before, hash_before, rows_after, hash_after, inserted, updated, deleted, unchanged = sums
    return PartitionPlan(
        rows_before=rows_before,
        rows_after=rows_after,
        inserted=inserted,
        updated=updated,
        deleted=deleted,
        unchanged=unchanged,
        fingerprint_before=digest(rows_before, hash_before) if exists else None,
        fingerprint_after=digest(rows_after, hash_after),
    )


def _engine_fingerprints(
    backend: Backend,
    scope: Scope,
    total: PartitionPlan,
    per_partition: dict[str, PartitionPlan],
) -> tuple[PartitionPlan, dict[str, PartitionPlan]]:
    """Fingerprints the engine computes itself: read before; after only where nothing changes.

    The engine hashes rows with its own function, so the fingerprint of rows not yet written
    cannot be predicted: a changing partition plans ``None`` after, never a wrong value.
    """
    settings = scope.settings
    table = TableRef.of(settings)

    def engine(plan: PartitionPlan, window: WriteWindow | None) -> PartitionPlan:
        found = backend.fingerprint(table, settings.partition_columns, window)
        before = digest(*found) if found is not None and scope.table_exists else None
        return replace(
            plan, fingerprint_before=before, fingerprint_after=None if plan.changed else before
        )

    window = scope.window
    parts = {p.key: p for p in window.partitions} if window is not None else {}
    per = {
        k: engine(p, WriteWindow((parts[k],), window.time_dimension) if window else None)
        for k, p in per_partition.items()
    }
    return engine(total, window if scope.cells else None), per


def _refused(
    backend: Backend,
    settings: WriteSettings,
    window: WriteWindow | None,
    refusal: IdempotencyError,
) -> PublishPlan:
    """A refused publish changes nothing: every partition as it is, with the refusal."""
    table = TableRef.of(settings)
    per_partition: dict[str, PartitionPlan] = {}
    parts = list(window.partitions) if window is not None and settings.partition_columns else []
    for part in parts if len(parts) > 1 else []:
        assert window is not None
        one = WriteWindow((part,), window.time_dimension)
        per_partition[part.key] = _as_is(
            backend.fingerprint(table, settings.partition_columns, one)
        )
    whole = backend.fingerprint(table, settings.partition_columns, window if parts else None)
    return PublishPlan(
        asset=settings.asset,
        table=table.name,
        mode=settings.mode,
        partitions=window.keys if window else [],
        total=_as_is(whole),
        per_partition=per_partition,
        refusal=str(refusal),
        refused_by=type(refusal).__name__,
    )


def _as_is(found: tuple[int, int] | None) -> PartitionPlan:
    """A partition the publish would leave as it is."""
    if found is None:
        return PartitionPlan()
    shown = digest(*found)
    return PartitionPlan(
        rows_before=found[0],
        rows_after=found[0],
        unchanged=found[0],
        fingerprint_before=shown,
        fingerprint_after=shown,
    )
