"""Report audit verdicts to Dagster: one check evaluation per check and partition.

A run of one day and a 31-day chunk report alike: every day of the run gets its own verdict, with
that day's failing count and sample, recorded by Dagster as SUCCEEDED or FAILED for that partition.
Rows that belong to no day of the run (stray rows, a NULL partition column, a key duplicated
across two days) cannot be blamed on one day, so they fail every day of the run and say so.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg
import duckdb
import pyarrow as pa
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)

from idem_assets.lib.dagster_layer.checks import Check, RowCount, SampleScope, Verdict
from idem_assets.lib.model.windows import PartitionWindow, WriteWindow, bound_for
from idem_assets.lib.sql import statements as batch_sql

_STAGED = "staged"
_SAMPLE_ROWS = 5


@dataclass(frozen=True)
class DayVerdict:
    """The outcome of one check for one partition of the run."""

    check: Check
    key: str
    passed: bool
    failing: int
    detail: str
    measured: dict[str, Any]
    sample: list[dict[str, Any]]


def markdown(rows: list[dict[str, Any]]) -> str:
    """A markdown table of ``rows``, as the UI renders it."""
    if not rows:
        return "(no rows)"
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def _failing_in_day(verdict: Verdict, key: str) -> tuple[int, int]:
    """``(failing units of this day, failing units no day of the run can be blamed for)``."""
    unit = verdict.check.unit
    if unit == "batch":
        return 0, verdict.failing
    if unit == "row":
        own = {k: int(v.get("failing", 0)) for k, v in verdict.per_partition.items()}
        return own.get(key, 0), max(verdict.failing - sum(own.values()), 0)
    return (1 if key in verdict.failed_partitions else 0), 0


def _detail(verdict: Verdict, key: str, own: int, unplaced: int) -> str:
    if verdict.check.unit == "partition":
        entry = ", ".join(f"{k} {v}" for k, v in verdict.per_partition.get(key, {}).items())
        return f"{key}: {'failed' if own else 'passed'} ({entry})"
    text = f"{own} failing row(s)"
    if unplaced:
        text += (
            f"; {unplaced} more failing row(s) of this run's batch belong to no single day"
            " (outside every day of its window, or a key that two days share), so every day of"
            " the run fails"
        )
    return text


def split_by_partition(
    report_table: pa.Table,
    verdicts: Sequence[Verdict],
    partition_expr: str,
    window: WriteWindow,
) -> list[DayVerdict]:
    """One :class:`DayVerdict` per check and partition of ``window``, with that day's sample."""
    con = duckdb.connect()
    try:
        con.register(_STAGED, report_table)
        names = report_table.schema.names
        ptype = report_table.schema.field(partition_expr).type if partition_expr in names else None
        days = []
        for verdict in verdicts:
            for w in window.partitions:
                own, unplaced = _failing_in_day(verdict, w.key)
                failing = own + unplaced
                sample: list[dict[str, Any]] = []
                if failing:
                    sample = _day_sample(con, verdict, w, partition_expr, ptype) or verdict.sample
                days.append(
                    DayVerdict(
                        check=verdict.check,
                        key=w.key,
                        passed=failing == 0,
                        failing=failing,
                        detail=_detail(verdict, w.key, own, unplaced),
                        measured=dict(verdict.per_partition.get(w.key, {})),
                        sample=sample[:_SAMPLE_ROWS],
                    )
                )
        return days
    finally:
        con.close()


def _day_sample(
    con: duckdb.DuckDBPyConnection,
    verdict: Verdict,
    day: PartitionWindow,
    partition_expr: str,
    ptype: pa.DataType | None,
) -> list[dict[str, Any]]:
    """Failing rows of one day, or ``[]`` where no row of the day is to blame."""
    # A row count's sample is the day's counts; any other sample needs the day's rows.
    if ptype is None and not isinstance(verdict.check, RowCount):
        return []
    in_day, params = "TRUE", []
    if ptype is not None:
        in_day, params = batch_sql.window_predicate(
            partition_expr, [(bound_for(day.start, ptype), bound_for(day.end, ptype))]
        )
    scope = SampleScope(
        con, _STAGED, verdict.per_partition, day.key, in_day, params, limit=_SAMPLE_ROWS
    )
    return verdict.check.sample(scope)


def judged_text(published: bool, run_failed_days: Sequence[str]) -> str:
    """What a verdict judged: the batch this materialization holds, or a refused batch."""
    if published:
        return "the staged batch, then published: this verdict's target materialization holds it"
    failed = ", ".join(run_failed_days[:10]) or "none"
    return (
        "the staged batch of this run, which was refused before any write because a blocking"
        f" check failed on {failed}: nothing of the run was published, so no materialization"
        " holds the batch judged here"
    )


def day_evaluations(
    days: Sequence[DayVerdict],
    asset_key: dg.AssetKey,
    targets: Mapping[str, AssetCheckEvaluationTargetMaterializationData],
    published: bool,
) -> list[dg.AssetCheckEvaluation]:
    """One ``AssetCheckEvaluation`` per check and day; ``targets`` maps days to what was judged."""
    blocking_failed = sorted({d.key for d in days if not d.passed and d.check.blocking})
    evaluations = []
    for d in days:
        metadata: dict[str, Any] = {
            **{k: _scalar(v) for k, v in d.measured.items()},
            "failing": d.failing,
            "detail": d.detail,
            "judged": judged_text(published, blocking_failed),
        }
        if d.sample:
            metadata["failing_sample"] = dg.MetadataValue.md(markdown(d.sample))
        evaluations.append(
            dg.AssetCheckEvaluation(
                asset_key=asset_key,
                check_name=d.check.name,
                passed=d.passed,
                metadata=metadata,
                target_materialization_data=targets.get(d.key) if published else None,
                severity=d.check.severity,
                description=d.check.description,
                blocking=d.check.blocking,
                partition=d.key,
            )
        )
    return evaluations


def _scalar(value: Any) -> Any:
    return value if value is None or isinstance(value, int | float | str | bool) else str(value)


def run_materializations(
    instance: dg.DagsterInstance, asset_key: dg.AssetKey, keys: Sequence[str], run_id: str
) -> dict[str, AssetCheckEvaluationTargetMaterializationData]:
    """The materialization ``run_id`` recorded for each of ``keys``, by partition key."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=list(keys)),
        limit=len(keys),
    ).records
    return {
        r.partition_key: AssetCheckEvaluationTargetMaterializationData(
            storage_id=r.storage_id, run_id=r.run_id, timestamp=r.timestamp
        )
        for r in records
        if r.run_id == run_id and r.partition_key is not None
    }
