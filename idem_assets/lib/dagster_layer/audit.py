"""Write-audit-publish: check the staged batch, and hand only a passing batch to the IO manager.

An IO manager cannot report asset-check results, so the audit runs in the asset's own step: the
batch is frozen as an Arrow table (the staged copy), every check is evaluated on it in one scan,
the results are reported to Dagster, and a failing blocking check raises before any output
exists. Nothing reaches the IO manager, readers keep the last good data, and downstream steps
are skipped. The Arrow table that was checked is the one that is published.
"""

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC
from typing import Any

import dagster as dg
import pyarrow as pa

from idem_assets.lib.dagster_layer.check_reports import (
    day_evaluations,
    judged_cells,
    judging,
    markdown,
    run_materializations,
    split_by_partition,
    unit_of,
)
from idem_assets.lib.dagster_layer.checks import (
    Check,
    Freshness,
    RowCount,
    SampleScope,
    Verdict,
    aggregate_sql,
    in_window,
    judge,
)
from idem_assets.lib.dagster_layer.frames import to_arrow
from idem_assets.lib.dagster_layer.plan import PLAN_TAG, REFUSAL_KEY, plan_run
from idem_assets.lib.model import expressions
from idem_assets.lib.model.errors import BlockingCheckError, ConfigurationError
from idem_assets.lib.model.identifiers import quote
from idem_assets.lib.model.settings import (
    DEDUPE_ORDER_BY,
    PARTITION_EXPR,
    PRIMARY_KEY,
    _raw,
    partition_columns,
)
from idem_assets.lib.model.windows import (
    PartitionWindow,
    WriteWindow,
    as_pairs,
    window_from_keys,
)
from idem_assets.lib.sql import statements as batch_sql
from idem_assets.lib.write.evaluator import embedded_database
from idem_assets.lib.write.streams import (
    DEFAULT_MEMORY,
    SpillArea,
    Spilled,
    as_stream,
    memory_limited,
    spill,
)

# The audit's own relations and columns sit next to the user's columns in one query. Each name
# holds a space, which validate_identifier refuses, so no user table or column can take it.
_STAGED_NAME, _KEY_NAME = "idem staged batch", "idem key"
_STAGED, _KEY = quote(_STAGED_NAME), quote(_KEY_NAME)
_OUTSIDE = "__outside_window__"


@dataclass(frozen=True)
class Batch:
    """An asset's output plus what the audit should expect of it.

    Return this instead of a bare table when the expected row count is only known while the asset
    runs (e.g. from a landing file's manifest); it overrides ``row_count``'s ``expected``.
    """

    #: A pyarrow Table, a pandas DataFrame, or a Polars DataFrame or LazyFrame.
    data: Any
    expected_rows: Mapping[str, int] | None = None


@dataclass(frozen=True)
class AuditReport:
    """Verdicts for every check, plus the staged table they were computed on."""

    table: "pa.Table | Spilled"
    verdicts: list[Verdict]

    @property
    def blocking_failures(self) -> list[Verdict]:
        """Failed verdicts of blocking checks."""
        return [v for v in self.verdicts if not v.passed and v.check.blocking]


def stage(
    data: Any,
    asset: str,
    primary_key: Sequence[str] = (),
    dedupe_order_by: Sequence[str] = (),
    memory: str = DEFAULT_MEMORY,
) -> "pa.Table | Spilled":
    """Freeze the batch, keeping the latest row per key when ``dedupe_order_by`` is set.

    As Arrow; a stream (a reader, ``ia.batches``, a LazyFrame, a DuckDB relation) is read once
    into the embedded DuckDB instead, which spills it to disk (:mod:`~idem_assets.lib.write.
    streams`), and the IO manager publishes that same copy.
    """
    stream = as_stream(data, asset)
    if stream is not None:
        staged = spill(stream, SpillArea(embedded_database(), temporary=False), memory)
        if not (primary_key and dedupe_order_by):
            return staged
        query, _ = batch_sql.dedupe(
            staged.name, primary_key, dedupe_order_by, list(staged.schema.names)
        )
        return staged.derived(query)
    table = to_arrow(data, asset)
    if not (primary_key and dedupe_order_by):
        return table
    with judging(table, _STAGED_NAME) as con:
        query, params = batch_sql.dedupe(
            _STAGED_NAME, primary_key, dedupe_order_by, table.column_names
        )
        return con.sql(query, params=params or None).to_arrow_table()


def audit_table(
    table: "pa.Table | Spilled",
    checks: Sequence[Check],
    partition_expr: object,
    window: WriteWindow | None,
    expected_rows: Mapping[str, int] | None = None,
) -> AuditReport:
    """Evaluate ``checks`` on ``table`` in one grouped scan, per partition given a window.

    ``partition_expr`` is the asset's metadata form: a column, or a dict of each dimension's
    column for a multi-dimensional asset (``None`` judges the table as one group).
    """
    if expected_rows is not None:
        checks = [
            dataclasses.replace(c, expected=expected_rows) if isinstance(c, RowCount) else c
            for c in checks
        ]
    pairs = as_pairs(partition_expr)
    timed = window is not None and bool(pairs) and window.timed
    if not timed and any(isinstance(c, Freshness) for c in checks):
        raise ConfigurationError(_freshness_needs_time(window))
    judged, cells = (table, [])
    if window is not None and pairs:
        judged, cells = judged_cells(table, partition_expr, window)
    with judging(judged, _STAGED_NAME) as con:
        aggs = ", ".join(aggregate_sql(checks))
        params: list[Any] = []
        if window is not None and pairs:
            # Each row is named by the partition whose box holds it; cells never overlap.
            keyed, params = batch_sql.rows_by_partition(_STAGED_NAME, cells, _KEY_NAME, _OUTSIDE)
            query = (
                f"SELECT {_KEY}, grouping({_KEY}), {aggs} FROM ({keyed})"
                f" GROUP BY GROUPING SETS (({_KEY}), ())"
            )
            windows = list(window.partitions)
        else:
            query = f"SELECT 'all', 1, {aggs} FROM {_STAGED}"
            windows = [PartitionWindow("all", *_unbounded())]
        grouped: dict[str, tuple[Any, ...]] = {}
        total: tuple[Any, ...] = ()
        for row in con.execute(query, params).fetchall():
            key, is_total, *values = row
            if is_total:
                total = tuple(values)
            if not is_total or window is None:
                grouped[key] = tuple(values)
        outside = grouped.get(_OUTSIDE, (0,))[0]
        verdicts = []
        for i, check in enumerate(checks, start=1):
            per = {k: (v[0], v[i]) for k, v in grouped.items() if k != _OUTSIDE}
            verdict = judge(check, windows, per, outside)
            # A duplicate key can span two days: count row failures over the whole batch.
            if check.unit == "row" and total:
                failing = int(total[i] or 0)
                verdict = dataclasses.replace(
                    verdict,
                    passed=failing == 0,
                    failing=failing,
                    detail=f"{failing} failing row(s)",
                )
            if not verdict.passed:
                verdict = dataclasses.replace(
                    verdict,
                    sample=check.sample(
                        SampleScope(
                            con,
                            _STAGED_NAME,
                            verdict.per_partition,
                            partition_columns=pairs,
                            window=window,
                        )
                    ),
                )
            verdicts.append(verdict)
        return AuditReport(table, verdicts)


def _freshness_needs_time(window: WriteWindow | None) -> str:
    what = "this asset is unpartitioned" if window is None else "its partitions have no time"
    return (
        f"freshness() is measured against the end of a partition's time window, and {what}."
        " Use it on a time-partitioned asset, or on one with a time dimension (a"
        " dg.MultiPartitionsDefinition with a daily dimension, say)."
    )


def _unbounded() -> tuple[Any, Any]:
    from datetime import datetime

    return datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC)


def check_results(report: AuditReport, asset_key: dg.AssetKey) -> list[dg.AssetCheckResult]:
    """One ``AssetCheckResult`` per check of an unpartitioned asset, with count and sample."""
    results = []
    for v in report.verdicts:
        metadata: dict[str, Any] = {
            "failing": v.failing,
            "detail": v.detail,
            "per_partition": dg.MetadataValue.json(v.per_partition),
        }
        if v.sample:
            metadata["failing_sample"] = dg.MetadataValue.md(markdown(v.sample))
        results.append(
            dg.AssetCheckResult(
                asset_key=asset_key,
                check_name=v.check.name,
                passed=v.passed,
                severity=v.check.severity,
                description=v.check.description,
                metadata=metadata,
            )
        )
    return results


def refusal(
    asset: str,
    window: WriteWindow | None,
    failures: Sequence[Verdict],
    failed_days: Sequence[str] = (),
) -> str:
    """The message of a blocking failure: which checks failed, on which partitions, and the fix."""
    lines = [f"  - {v.check.name}: {v.detail}" for v in failures]
    where = window.describe() if window else "(unpartitioned)"
    days, rerun = "", "this partition"
    if window is not None and len(window.partitions) > 1:
        unit = unit_of(window)
        days = (
            f"\n{unit.capitalize()}s that failed: {', '.join(failed_days)}; each check's"
            f" partition view shows every {unit}'s verdict, and no {unit} of the run was"
            " published."
        )
        rerun = "the failed partitions (in the UI: Materialize..., the Failed selection)"
    return (
        f"Asset '{asset}', partition {where}: {len(failures)} blocking check(s) failed on the"
        " staged batch, so it was not published and readers keep the last good data:\n"
        + "\n".join(lines)
        + days
        + "\nEach check's failing_sample in the UI shows the offending rows or partitions. Fix"
        f" the input (or the check), then rerun {rerun}."
    )


def run_audit(
    context: dg.AssetExecutionContext,
    output: Any,
    checks: Sequence[Check],
    metadata: Mapping[str, Any],
) -> Iterator[dg.AssetCheckResult | dg.AssetCheckEvaluation | dg.Output]:
    """Stage ``output`` and audit it; publish it and report every verdict, or raise on a blocker.

    A partitioned asset reports one evaluation per check and partition of the run (a day, a static
    key, a (day, region) cell). Verdicts come after
    the output, so each points at the materialization it judged; a refused batch reports its
    verdicts without a target and raises before any output exists.
    """
    asset_key = context.asset_key
    asset = asset_key.to_user_string()
    batch = output if isinstance(output, Batch) else Batch(output)
    # A single column may be given as a bare string, as resolve_settings accepts.
    key = _raw(metadata.get(PRIMARY_KEY)) or ()
    order = _raw(metadata.get(DEDUPE_ORDER_BY)) or ()
    key = (key,) if isinstance(key, str) else tuple(key)
    order = (order,) if isinstance(order, str) else tuple(order)
    # Read once: a stream is staged in the embedded DuckDB, under the IO manager's limit.
    data = batch.data
    stream = None if isinstance(data, pa.Table) else as_stream(data, asset)
    memory = _staging_memory(context)
    limited = memory_limited(embedded_database(), memory) if stream else nullcontext()
    with limited:
        table = stage(stream or data, asset, key, order, memory)
        try:
            yield from _audited(context, table, batch, checks, metadata, asset)
        finally:
            if isinstance(table, Spilled):
                # Published by now (the IO manager read it while the Output was handled).
                table.drop()


def _staging_memory(context: dg.AssetExecutionContext) -> str:
    """The staging memory of the IO manager that will publish this asset (the default else)."""
    key = context.assets_def.get_io_manager_key_for_asset_key(context.asset_key)
    io_manager = context.resources.original_resource_dict.get(key)
    return getattr(io_manager, "staging_memory", None) or DEFAULT_MEMORY


def _audited(
    context: dg.AssetExecutionContext,
    table: "pa.Table | Spilled",
    batch: Batch,
    checks: Sequence[Check],
    metadata: Mapping[str, Any],
    asset: str,
) -> Iterator[dg.AssetCheckResult | dg.AssetCheckEvaluation | dg.Output]:
    """Audit the staged ``table``; publish it and report every verdict, or raise on a blocker."""
    asset_key = context.asset_key
    partition_expr = _raw(metadata.get(PARTITION_EXPR))
    partition_expr = dict(partition_expr) if isinstance(partition_expr, Mapping) else partition_expr
    window = None
    if context.has_partition_key_range or context.has_partition_key:
        assert context.assets_def.partitions_def is not None
        window = window_from_keys(context.assets_def.partitions_def, context.partition_keys, asset)
    report = audit_table(table, checks, partition_expr, window, batch.expected_rows)
    failures = report.blocking_failures
    partitioned = window is not None and bool(partition_expr)
    if plan_run(context):
        # A plan records no verdict: the checks' history is of batches that were published.
        # Its IO manager reports the refusal with the plan instead.
        yield from _planned(context, report, partition_expr, window, asset)
        return
    if not partitioned:
        results = check_results(report, asset_key)
        if failures:
            yield from results
            raise BlockingCheckError(refusal(asset, window, failures))
        yield dg.Output(table)
        yield from results
        return
    assert window is not None
    days = split_by_partition(report.table, report.verdicts, partition_expr, window)
    if failures:
        yield from _reported(context, day_evaluations(days, asset_key, {}, published=False))
        raise BlockingCheckError(refusal(asset, window, failures, _failed_days(days)))
    yield dg.Output(table)
    targets = run_materializations(context.instance, asset_key, window.keys, context.run.run_id)
    yield from _reported(context, day_evaluations(days, asset_key, targets, published=True))


def _failed_days(days: Sequence[Any]) -> list[str]:
    return sorted({d.key for d in days if not d.passed and d.check.blocking})


def _planned(
    context: dg.AssetExecutionContext,
    report: AuditReport,
    partition_expr: Any,
    window: WriteWindow | None,
    asset: str,
) -> Iterator[dg.Output | dg.AssetCheckEvaluation]:
    """The batch for a plan with the refusal it would meet, then every verdict, none blocking.

    Dagster fails a step on a failed blocking verdict; a plan reports the refusal instead, so
    its verdicts are recorded as the plan's (``judged`` says so) and none blocks.
    """
    asset_key = context.asset_key
    failures = report.blocking_failures
    if window is not None and partition_expr:
        days = split_by_partition(report.table, report.verdicts, partition_expr, window)
        found = day_evaluations(days, asset_key, {}, published=False)
        failed = _failed_days(days)
    else:
        found = [_evaluation(r) for r in check_results(report, asset_key)]
        failed = []
    metadata = {REFUSAL_KEY: refusal(asset, window, failures, failed)} if failures else {}
    yield dg.Output(report.table, metadata=metadata)
    yield from _reported(context, [_as_planned(e) for e in found])


def _evaluation(result: dg.AssetCheckResult) -> dg.AssetCheckEvaluation:
    assert result.asset_key is not None and result.check_name is not None
    return dg.AssetCheckEvaluation(
        asset_key=result.asset_key,
        check_name=result.check_name,
        passed=result.passed,
        metadata=result.metadata,
        severity=result.severity,
        description=result.description,
    )


def _as_planned(evaluation: dg.AssetCheckEvaluation) -> dg.AssetCheckEvaluation:
    """A verdict of a plan's batch: it blocks nothing, and it says it judged a plan."""
    return dg.AssetCheckEvaluation(
        asset_key=evaluation.asset_key,
        check_name=evaluation.check_name,
        passed=evaluation.passed,
        metadata={
            **evaluation.metadata,
            "judged": "the staged batch of a plan run, which publishes nothing",
            PLAN_TAG: True,
        },
        severity=evaluation.severity,
        description=evaluation.description,
        blocking=False,
        partition=evaluation.partition,
    )


def _reported(
    context: dg.AssetExecutionContext, evaluations: Sequence[dg.AssetCheckEvaluation]
) -> Iterator[dg.Output | dg.AssetCheckEvaluation]:
    """The evaluations, each check's (empty) step output first, as an AssetCheckResult has."""
    selected = context.selected_asset_check_keys
    done: set[dg.AssetCheckKey] = set()
    for evaluation in evaluations:
        check_key = evaluation.asset_check_key
        if check_key in selected and check_key not in done:
            done.add(check_key)
            yield dg.Output(
                None, output_name=context.assets_def.get_output_name_for_asset_check_key(check_key)
            )
        yield evaluation


def audited_asset(
    *, checks: Sequence[Check] = (), **asset_kwargs: Any
) -> Callable[[Callable[..., Any]], dg.AssetsDefinition]:
    """Like ``@dg.asset``, but the returned batch is audited by ``checks`` before it is published.

    The function returns a DataFrame, an Arrow table or a :class:`Batch`. A partitioned asset (by
    time, by static or dynamic keys, or by several dimensions) also gets the ``in_window`` check
    on its ``partition_expr`` column(s). Each check becomes a blocking (or, with
    ``blocking=False``, a WARN) ``AssetCheckSpec``, partitioned like the asset, so every run
    records one verdict per partition: per day, per key, per (day, region) cell.
    """

    def decorator(fn: Callable[..., Any]) -> dg.AssetsDefinition:
        params = list(inspect.signature(fn).parameters)
        if not params or params[0] != "context":
            raise ConfigurationError(
                f"@audited_asset {fn.__name__}: the audit needs the run's partition window, so"
                " the function's first parameter must be `context` (e.g."
                f" def {fn.__name__}(context: dg.AssetExecutionContext, ...))."
            )
        name = asset_kwargs.get("name") or fn.__name__
        prefix = asset_kwargs.get("key_prefix") or []
        prefix = [prefix] if isinstance(prefix, str) else list(prefix)
        asset_key = dg.AssetKey.from_coercible(asset_kwargs.get("key") or [*prefix, name])
        metadata = dict(asset_kwargs.get("metadata") or {})
        partitions_def = asset_kwargs.get("partitions_def")
        asset = asset_key.to_user_string()
        pairs, time_column = partition_columns(metadata.get(PARTITION_EXPR), partitions_def, asset)
        computed = [c for _, c in pairs if expressions.is_expression(c)]
        if computed:
            raise ConfigurationError(
                f"@audited_asset {asset}: metadata '{PARTITION_EXPR}' is the SQL expression"
                f" {computed[0]}, but the audit splits the batch into its partitions by a column"
                " of the batch, in Arrow, before anything is written. Nothing was changed. Fix: "
                + expressions.compute_instead(computed[0])
                + "."
            )
        all_checks = list(checks)
        if partitions_def is not None and pairs:
            all_checks.append(in_window(*(c for _, c in pairs)))
            if time_column is None and any(isinstance(c, Freshness) for c in checks):
                raise ConfigurationError(
                    f"@audited_asset {asset}: "
                    + _freshness_needs_time(WriteWindow((PartitionWindow("any"),), None))
                )
        names = [c.name for c in all_checks]
        if len(set(names)) != len(names):
            raise ConfigurationError(
                f"Asset '{asset_key.to_user_string()}' declares two checks with the same name"
                f" ({names}); pass name=... to one of them."
            )

        @functools.wraps(fn)
        def compute(context: dg.AssetExecutionContext, *args: Any, **kwargs: Any) -> Iterator[Any]:
            yield from run_audit(context, fn(context, *args, **kwargs), all_checks, metadata)

        # The wrapper yields Output(pa.Table); the function's own return annotation (often
        # Batch) must not become the output's Dagster type.
        compute.__annotations__ = {k: v for k, v in fn.__annotations__.items() if k != "return"}
        compute.__signature__ = inspect.signature(fn).replace(  # type: ignore[attr-defined]
            return_annotation=inspect.Signature.empty
        )
        specs = [c.spec(asset_key, partitions_def) for c in all_checks]
        return dg.asset(check_specs=specs, **asset_kwargs)(compute)

    return decorator
