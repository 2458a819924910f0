"""Plan runs: a run tagged ``idem/plan`` stages, judges and compares each batch, writing nothing.

The IO managers hand a plan run's outputs here instead of publishing them
(:func:`handle_plan`). Each partition's plan is an ``AssetObservation`` carrying its counts, its
fingerprints and its refusal, so the asset's partitions show what a rerun would change, and
each planned step ends by logging the run's plan so far as a table: the last one in the run log
is the whole run's.

Dagster records a materialization for every asset output an IO manager handles, unless the run
carries its ``dagster/defer_asset_events`` tag: a plan run needs both tags (:data:`PLAN_TAGS`),
and a run with ``idem/plan`` alone is refused before anything is read, so a plan can never add
to the materialization history. Nothing is written to the warehouse, no data version is
recorded, and the outbox lists what it would deliver without delivering it.
"""

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc

from idem_assets.lib.dagster_layer.frames import from_arrow, reads_arrow
from idem_assets.lib.model.errors import BlockingCheckError, ConfigurationError
from idem_assets.lib.model.settings import WriteSettings
from idem_assets.lib.model.windows import Region, WriteWindow, stored_region
from idem_assets.lib.sql import statements
from idem_assets.lib.sql.predicates import arrow_expression, has_expression
from idem_assets.lib.write.evaluator import embedded
from idem_assets.lib.write.plan import PartitionPlan, PublishPlan, plan
from idem_assets.lib.write.seam import Backend, EngineBatch
from idem_assets.lib.write.streams import DEFAULT_MEMORY, Spilled, Stream

#: The run tag that makes a run a plan.
PLAN_TAG = "idem/plan"
#: Dagster's run tag that keeps its asset events (materializations) out of the run.
DEFER_TAG = "dagster/defer_asset_events"
#: The tags of a plan run: ``dagster job backfill ... --tags '{...}'`` takes them as JSON.
PLAN_TAGS = {PLAN_TAG: "true", DEFER_TAG: "true"}
#: Output metadata by which the audit hands its blocking refusal to a plan's IO manager.
REFUSAL_KEY = "idem/plan_refusal"

_TRUE = ("true", "1", "yes")


def is_plan(tags: Mapping[str, str]) -> bool:
    """Whether a run with ``tags`` is a plan run."""
    return tags.get(PLAN_TAG, "").strip().lower() in _TRUE


def plan_run(context: dg.OutputContext | dg.InputContext | dg.AssetExecutionContext) -> bool:
    """Whether this step belongs to a plan run."""
    if isinstance(context, dg.AssetExecutionContext):
        return is_plan(context.run.tags)
    return is_plan(context.step_context.dagster_run.tags)


def plan_output(
    context: dg.OutputContext,
    backend: Callable[[], AbstractContextManager[Backend]],
    batch: "pa.Table | EngineBatch | Stream | Spilled",
    settings: WriteSettings,
    window: WriteWindow | None,
    memory: str = DEFAULT_MEMORY,
) -> None:
    """Plan the batch instead of publishing it, and report the plan; nothing is written.

    A streamed batch is staged under ``memory``, as its publish would stage it.
    """
    refuse_recorded_plan(context, settings.asset, window)
    refused = refusal_of(context)
    with backend() as opened:
        planned = plan(
            opened,
            batch,
            settings,
            window,
            refusal=BlockingCheckError(refused) if refused else None,
            keep_rows=True,
            memory=memory,
        )
    _remember(context.step_context.run_id, context.asset_key, planned, window)
    handle_plan(context, planned, settings, window)


@dataclass(frozen=True)
class _PlannedRows:
    """An asset's window as its plan would leave it, for the inputs of assets downstream."""

    window: WriteWindow
    rows: pa.Table


#: This process's current plan run: its id, each planned asset's rows, and which planned rows
#: each downstream asset read. Steps of one process (the in-process executor, the location's
#: default) see their upstream's plan; a step in another process reads the stored rows.
_RUN: dict[str, Any] = {"id": None, "rows": {}, "read": {}}


def _current(run_id: str) -> dict[str, Any]:
    if _RUN["id"] != run_id:
        # One plan run at a time per process: a new one forgets the last one's rows.
        _RUN.update(id=run_id, rows={}, read={})
    return _RUN


def _remember(
    run_id: str, key: dg.AssetKey, planned: PublishPlan, window: WriteWindow | None
) -> None:
    if planned.rows is not None and window is not None:
        _current(run_id)["rows"][key] = _PlannedRows(window, planned.rows)


def planned_upstream(context: dg.InputContext) -> _PlannedRows | None:
    """The rows the plan of this input's upstream would publish, if it ran in this process."""
    if not plan_run(context):
        return None
    return _current(context.step_context.run_id)["rows"].get(context.asset_key)


def planned_input(
    context: dg.InputContext,
    backend: Callable[[], AbstractContextManager[Backend]],
    settings: WriteSettings,
    window: WriteWindow | None,
    found: _PlannedRows,
) -> Any:
    """An input of a plan run: the stored rows, the partitions its upstream planned replaced.

    A plan writes nothing, so a downstream asset would otherwise plan against what is stored;
    with its upstream's planned rows it sees what a real run would hand it (a table that does
    not exist yet holds no rows but the planned ones).
    """
    nothing = context.has_asset_partitions and not context.asset_partition_keys
    with backend() as opened:
        stored = opened.load(settings, window, nothing, True)
    assert stored is None or isinstance(stored, pa.Table)
    stored = found.rows.schema.empty_table() if stored is None else stored
    rows = stored if nothing else _with_planned_rows(context, settings, window, stored, found)
    frame_type = context.dagster_type.typing_type
    return from_arrow(rows, frame_type) if reads_arrow(frame_type) else rows.to_pandas()


def _with_planned_rows(
    context: dg.InputContext,
    settings: WriteSettings,
    window: WriteWindow | None,
    stored: pa.Table,
    found: _PlannedRows,
) -> pa.Table:
    """The stored rows with the partitions the upstream planned in this run replaced."""
    run = _current(context.step_context.run_id)
    if window is None or not settings.partition_columns:
        return stored
    keys = [k for k in window.keys if k in set(found.window.keys)]
    if not keys or set(found.rows.column_names) != set(stored.column_names):
        return stored
    planned = WriteWindow(
        tuple(p for p in found.window.partitions if p.key in keys), found.window.time_dimension
    )
    types = dict(zip(stored.column_names, stored.schema.types, strict=True))
    region = stored_region(planned, settings.partition_columns, types, settings.table)
    rows = found.rows.select(stored.column_names).cast(stored.schema)
    merged = pa.concat_tables([_split(stored, region, types)[1], _split(rows, region, types)[0]])
    order = [c for c in settings.partition_names if c in merged.column_names]
    if order:
        merged = merged.sort_by([(c, "ascending") for c in order])
    reader = context.step_context.node_handle
    run["read"].setdefault(str(reader), set()).add(context.asset_key.to_user_string())
    return merged


#: The column that says whether a row is in the window, while a region is evaluated in DuckDB.
_IN_WINDOW = "idem-in-window"


def _split(
    table: pa.Table, region: Region, types: Mapping[str, pa.DataType]
) -> tuple[pa.Table, pa.Table]:
    """``table``'s rows inside ``region``, and the others.

    A ``partition_expr`` expression is SQL: it is evaluated in the embedded DuckDB, as the
    guards evaluate it, where a region of columns is a pyarrow filter.
    """
    if not has_expression(region):
        inside = arrow_expression(region, dict(types))
        return table.filter(inside), table.filter(~inside)
    evaluator = embedded()
    try:
        name = evaluator.register(table).strip('"')
        cells = [("in", box) for box in region]
        flagged = evaluator.arrow(statements.rows_by_partition(name, cells, _IN_WINDOW, "out"))
    finally:
        evaluator.release()
        evaluator.conn.close()
    inside = pc.field(_IN_WINDOW) == "in"
    inner, outer = flagged.filter(inside), flagged.filter(~inside)
    return (
        inner.drop_columns([_IN_WINDOW]).cast(table.schema),
        outer.drop_columns([_IN_WINDOW]).cast(table.schema),
    )


def refuse_recorded_plan(context: dg.OutputContext, asset: str, window: WriteWindow | None) -> None:
    """Refuse a plan run Dagster would record materializations for (no defer tag)."""
    tags = context.step_context.dagster_run.tags
    if tags.get(DEFER_TAG, "").strip().lower() in _TRUE:
        return
    where = f"asset '{asset}'" + (f", partition {window.describe()}" if window else "")
    raise ConfigurationError(
        f"Refused to plan {where}: the run is tagged {PLAN_TAG} but not {DEFER_TAG}, so Dagster"
        " would record each plan as a materialization of the asset (as if it had been"
        " published) and its data version would change. Nothing was changed. Fix: launch the"
        f" plan with both tags, e.g. --tags '{_tags_json()}'."
    )


def _tags_json() -> str:
    return "{" + ", ".join(f'"{k}": "{v}"' for k, v in PLAN_TAGS.items()) + "}"


def refusal_of(context: dg.OutputContext) -> str:
    """The blocking refusal the audit handed over with the output ("" when none)."""
    found = context.output_metadata.get(REFUSAL_KEY)
    if found is None:
        return ""
    return str(getattr(found, "value", found))


def handle_plan(
    context: dg.OutputContext,
    planned: PublishPlan,
    settings: WriteSettings,
    window: WriteWindow | None,
) -> None:
    """Report ``planned``: an observation per partition, the run's plan so far in the log."""
    upstream = _upstream(context)
    keys = window.keys if window is not None else [None]
    # Read before this step logs its own: an observation can be stored as soon as it is logged.
    rows = [*_earlier_rows(context), *plan_rows(planned, keys)]
    for key in keys:
        context.log_event(
            dg.AssetObservation(
                asset_key=context.asset_key,
                partition=key,
                metadata=plan_metadata(planned, planned.partition(key), upstream),
                tags={PLAN_TAG: "true"},
            )
        )
    if planned.refused:
        context.log.warning(f"Plan: the publish would be refused. {planned.refusal}")
    stored = [u.removeprefix("stored rows of ") for u in upstream if u.startswith("stored")]
    if stored:
        context.log.info(
            f"Plan: '{settings.asset}' read the stored rows of {', '.join(stored)}: a plan"
            " writes nothing, and no plan of this run's steps in this process held them, so it"
            " plans against what is stored now."
        )
    context.log.info("Plan of this run so far:\n" + plan_table(rows))


def plan_metadata(
    plan: PublishPlan, part: PartitionPlan, upstream: Sequence[str] = ()
) -> dict[str, Any]:
    """One partition's plan as observation metadata."""
    # The UI lists entries in this order, on a partition's page above its materialization's:
    # the verdict and the counts first, so they show without scrolling.
    md: dict[str, Any] = {
        "plan": _verdict(plan, part),
        "rows_inserted": part.inserted,
        "rows_updated": part.updated,
        "rows_deleted": part.deleted,
        "rows_unchanged": part.unchanged,
        "rows_before": part.rows_before,
        "rows_after": part.rows_after,
        "fingerprint_before": part.fingerprint_before or "(no table)",
        "fingerprint_after": _after(part),
        "refused": plan.refused,
    }
    if plan.refused:
        md["refusal"] = dg.MetadataValue.md(plan.refusal)
    if upstream:
        md["planned_against"] = ", ".join(upstream)
    return md | {"write_mode": plan.mode, "dagster/table_name": plan.table}


def _verdict(plan: PublishPlan, part: PartitionPlan) -> str:
    if plan.refused:
        return f"refused ({plan.refused_by})"
    return "changes" if part.changed else "no change"


#: The summary table's columns.
COLUMNS = (
    "asset",
    "partition",
    "plan",
    "inserted",
    "updated",
    "deleted",
    "unchanged",
    "fingerprint before",
    "fingerprint after",
)


def plan_rows(plan: PublishPlan, keys: Sequence[str | None]) -> list[tuple[str, ...]]:
    """The summary table's rows of one plan, a row per partition."""
    rows = []
    for key in keys:
        part = plan.partition(key)
        rows.append(
            (
                plan.asset,
                key or "-",
                _verdict(plan, part),
                str(part.inserted),
                str(part.updated),
                str(part.deleted),
                str(part.unchanged),
                part.fingerprint_before or "(no table)",
                _after(part),
            )
        )
    return rows


#: An asset with more unchanged partitions than this shows them as one row.
LISTED_UNCHANGED = 3


def plan_table(rows: Sequence[Sequence[str]]) -> str:
    """Rows as an aligned text table under :data:`COLUMNS`; many unchanged partitions as one."""
    rows = _collapsed(rows)
    widths = [max(len(r[i]) for r in [COLUMNS, *rows]) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
        for row in [COLUMNS, *rows]
    ]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def _collapsed(rows: Sequence[Sequence[str]]) -> list[Sequence[str]]:
    """Each asset's rows, its unchanged partitions summed into one row when there are many."""
    by_asset: dict[str, list[Sequence[str]]] = {}
    for row in rows:
        by_asset.setdefault(row[0], []).append(row)
    shown: list[Sequence[str]] = []
    for asset, found in by_asset.items():
        same = [r for r in found if r[2] == "no change"]
        if len(same) <= LISTED_UNCHANGED:
            shown.extend(found)
            continue
        shown.extend(r for r in found if r[2] != "no change")
        unchanged = str(sum(int(r[6]) for r in same))
        shown.append((asset, f"{len(same)} others", "no change", "0", "0", "0", unchanged, "", ""))
    return shown


def observation_rows(events: Sequence[dg.EventLogRecord]) -> list[tuple[str, ...]]:
    """The summary table's rows from a run's plan observations, in the order they were logged."""
    rows = []
    for record in events:
        event = record.asset_observation
        if event is None or (event.tags or {}).get(PLAN_TAG) != "true":
            continue
        md = event.metadata

        def text(name: str, md: Mapping[str, Any] = md) -> str:
            value = md.get(name)
            return str(getattr(value, "value", value))

        rows.append(
            (
                event.asset_key.to_user_string(),
                event.partition or "-",
                text("plan"),
                text("rows_inserted"),
                text("rows_updated"),
                text("rows_deleted"),
                text("rows_unchanged"),
                text("fingerprint_before"),
                text("fingerprint_after"),
            )
        )
    return rows


def run_plan(instance: dg.DagsterInstance, run_id: str) -> list[tuple[str, ...]]:
    """A plan run's summary rows, as its observations recorded them."""
    found = instance.get_records_for_run(
        run_id, of_type=dg.DagsterEventType.ASSET_OBSERVATION, limit=100_000
    ).records
    return observation_rows(found)


def _earlier_rows(context: dg.OutputContext) -> list[tuple[str, ...]]:
    """Rows of the plans this run's earlier steps recorded."""
    return run_plan(context.step_context.instance, context.step_context.run_id)


def _upstream(context: dg.OutputContext) -> list[str]:
    """The asset's upstream assets, each with whether its inputs read planned or stored rows."""
    step = context.step_context
    node = step.job_def.asset_layer.get(context.asset_key)
    planned = _current(step.run_id)["read"].get(str(step.node_handle), set())
    return sorted(
        f"{'planned' if k.to_user_string() in planned else 'stored'} rows of {k.to_user_string()}"
        for k in node.parent_keys
        if k != context.asset_key
    )


def _after(part: PartitionPlan) -> str:
    """The planned fingerprint, or why there is none."""
    if part.fingerprint_after:
        return part.fingerprint_after
    return "(the engine's own, known once written)" if part.rows_after else "(no table)"
