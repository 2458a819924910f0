"""Plan runs on every engine: what a rerun would change, reported per partition, nothing changed.

A run tagged ``idem/plan`` (with Dagster's ``dagster/defer_asset_events``) stages and judges
each batch and compares it with the stored window: it must leave every table, the instance's
materializations and the outbox ledger as they were, and report exactly what the publish that
follows then changes.
"""

from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import idem_assets as ia
from tests.conformance.conftest import FULL, Store
from tests.conformance.test_replace_contract import ALL_DAYS, EVENTS, events, per_day
from tests.helpers import DAILY, NOW, range_tags, settings

#: Day 2's correction: three amounts changed, two rows dropped, one row added.
CHANGED, DROPPED = (0, 10, 20), (30, 40)

MODES: dict[str, tuple[str, dict[str, Any]]] = {
    "overwrite": ("io_manager", EVENTS),
    "merge": ("merge_io_manager", EVENTS),
    # An upsert keeps the keys its batch lacks: everyday runs leave it to IDEM_FULL=1.
    "upsert": ("merge_io_manager", {**EVENTS, "delete_missing": False}),
}


def corrected(day: str) -> pa.Table:
    """Day 2's events after a fix; every other day as first published."""
    batch = events(day)
    if day != ALL_DAYS[1]:
        return batch
    rows = batch.to_pylist()
    for i in CHANGED:
        rows[i]["amount"] += 0.5
    rows = [r for i, r in enumerate(rows) if i not in DROPPED]
    rows.append({**rows[-1], "event_id": rows[-1]["event_id"] + 1})
    return pa.Table.from_pylist(rows, schema=batch.schema)


def events_asset(mode: str, source: Any) -> dg.AssetsDefinition:
    """The events asset on ``mode``'s IO manager, its batch ``source(day)`` for each day."""
    io_manager, metadata = MODES[mode]

    @dg.asset(name="events", partitions_def=DAILY, io_manager_key=io_manager, metadata=metadata)
    def compute(context: dg.AssetExecutionContext) -> pa.Table:
        return pa.concat_tables([source(day) for day in context.partition_keys])

    return compute


def report_asset(ledger: Path) -> tuple[dg.AssetsDefinition, ia.Outbox]:
    """A downstream asset exporting each day's events through the outbox."""
    outbox = ia.Outbox(ledger=str(ledger))

    @dg.asset(name="events_report", partitions_def=DAILY, deps=[], ins={"events": dg.AssetIn()})
    def compute(
        context: dg.AssetExecutionContext, events: pa.Table, outbox: ia.Outbox
    ) -> dg.MaterializeResult:
        for day in context.partition_keys:
            start = datetime.fromisoformat(day)
            rows = events.filter(
                (pc.field("event_at") >= start) & (pc.field("event_at") < start + timedelta(days=1))
            )
            outbox.deliver(context, "export", rows, lambda delivery: None, partition=day)
        return dg.MaterializeResult()

    return compute, outbox


def run(
    store: Store,
    instance: dg.DagsterInstance,
    assets: Sequence[dg.AssetsDefinition],
    days: Sequence[str],
    plan: bool = False,
    outbox: ia.Outbox | None = None,
) -> dg.ExecuteInProcessResult:
    """One run of ``days`` (one day, or a range as one run)."""
    tags = dict(ia.PLAN_TAGS) if plan else {}
    key = days[0] if len(days) == 1 else None
    if key is None:
        tags |= range_tags(days[0], days[-1])
    resources: dict[str, Any] = {**store.resources()}
    if outbox is not None:
        resources["outbox"] = outbox
    return dg.materialize(
        list(assets), resources=resources, partition_key=key, tags=tags, instance=instance
    )


def plans(result: dg.ExecuteInProcessResult, asset: str = "events") -> dict[str, dict[str, Any]]:
    """Each partition's plan in the run's observations, metadata values by name."""
    found = {}
    for event in result.all_events:
        if event.event_type != dg.DagsterEventType.ASSET_OBSERVATION:
            continue
        observation = event.asset_observation_data.asset_observation
        if observation.asset_key == dg.AssetKey(asset):
            md = {k: getattr(v, "value", v) for k, v in observation.metadata.items()}
            found[str(observation.partition)] = md
    return found


def history(instance: dg.DagsterInstance, *assets: str) -> list[tuple[str, int]]:
    """Every materialization the instance recorded of ``assets``, by storage id."""
    return [
        (asset, record.storage_id)
        for asset in assets
        for record in instance.fetch_materializations(dg.AssetKey(asset), limit=1000).records
    ]


@pytest.mark.parametrize("mode", ["merge", "overwrite"])
def test_an_identical_rerun_plans_no_change_and_touches_nothing(
    store: Store, mode: str, tmp_path: Path
) -> None:
    """A plan of the days as published: 0 changes each, nothing stored, recorded or delivered."""
    report, outbox = report_asset(tmp_path / "outbox.sqlite")
    chain = [events_asset(mode, events), report]
    with dg.DagsterInstance.ephemeral() as instance:
        run(store, instance, chain, ALL_DAYS, outbox=outbox)
        tables, days, recorded = store.snapshot(), per_day(store), history(instance, *_NAMES)
        ledger = outbox.records()
        version = instance.get_latest_materialization_event(dg.AssetKey("events"))
        result = run(store, instance, chain, ALL_DAYS, plan=True, outbox=outbox)
        assert result.success
        planned = plans(result)
        assert {
            d: (p["plan"], p["rows_inserted"], p["rows_updated"]) for d, p in planned.items()
        } == {d: ("no change", 0, 0) for d in ALL_DAYS}
        assert {d: (p["rows_deleted"], p["rows_unchanged"]) for d, p in planned.items()} == {
            d: (0, 1000) for d in ALL_DAYS
        }
        assert {d: p["fingerprint_before"] for d, p in planned.items()} == days
        assert {d: p["fingerprint_after"] for d, p in planned.items()} == days
        assert store.snapshot() == tables
        assert history(instance, *_NAMES) == recorded
        assert instance.get_latest_materialization_event(dg.AssetKey("events")) == version
        assert outbox.records() == ledger
        log = _log(instance, result)
        assert log.count("Outbox (plan): would skip") == len(ALL_DAYS)


_NAMES = ("events", "events_report")


def _log(instance: dg.DagsterInstance, result: dg.ExecuteInProcessResult) -> str:
    return "\n".join(e.user_message for e in instance.all_logs(result.run_id))


def _by_key(rows: list[tuple]) -> dict[int, tuple]:
    return {r[0]: r for r in rows}


@pytest.mark.parametrize("mode", sorted(MODES) if FULL else ["merge", "overwrite"])
def test_a_corrected_day_plans_exactly_what_its_publish_then_changes(
    store: Store, mode: str, tmp_path: Path
) -> None:
    """A fixed day's plan: its changed rows and the fingerprint the publish then records."""
    report, outbox = report_asset(tmp_path / "outbox.sqlite")
    with dg.DagsterInstance.ephemeral() as instance:
        run(store, instance, [events_asset(mode, events), report], ALL_DAYS, outbox=outbox)
        fixed = [events_asset(mode, corrected), report]
        before, ledger = store.rows("events"), outbox.records()
        planning = run(store, instance, fixed, ALL_DAYS, plan=True, outbox=outbox)
        planned = plans(planning)
        assert store.rows("events") == before
        assert outbox.records() == ledger
        # The report planned against the events' planned rows: only the fixed day would go out.
        log = _log(instance, planning)
        assert log.count("Outbox (plan): would deliver") == 1
        assert f"would deliver export of asset 'events_report', partition {ALL_DAYS[1]}" in log
        assert log.count("Outbox (plan): would skip") == len(ALL_DAYS) - 1
        assert plans(planning, "events_report") == {}
        published = run(store, instance, fixed, ALL_DAYS, outbox=outbox)
        after = store.rows("events")
        if mode == "overwrite":
            # By content: a changed row is one deleted and one inserted.
            gone, new = Counter(before) - Counter(after), Counter(after) - Counter(before)
            expected = (sum(new.values()), 0, sum(gone.values()))
        else:
            old, now = _by_key(before), _by_key(after)
            changed = sum(1 for k in now if k in old and now[k] != old[k])
            expected = (len(now.keys() - old.keys()), changed, len(old.keys() - now.keys()))
        day = planned[ALL_DAYS[1]]
        assert (day["rows_inserted"], day["rows_updated"], day["rows_deleted"]) == expected
        assert (
            expected
            == {
                "overwrite": (len(CHANGED) + 1, 0, len(CHANGED) + len(DROPPED)),
                "merge": (1, len(CHANGED), len(DROPPED)),
                "upsert": (1, len(CHANGED), 0),
            }[mode]
        )
        assert day["rows_after"] == sum(1 for r in after if r[1].date().isoformat() == ALL_DAYS[1])
        recorded = {
            e.materialization.partition: e.materialization.metadata
            for e in published.get_asset_materialization_events()
            if e.materialization.asset_key == dg.AssetKey("events")
        }
        with store.open() as backend:
            predicts = backend.capabilities.plan_predicts_fingerprints
        # An engine that hashes rows its own way (Spark) plans no fingerprint for a changing day.
        assert {d: p["fingerprint_after"] for d, p in planned.items()} == {
            d: md["fingerprint"].value
            if predicts or planned[d]["plan"] == "no change"
            else "(the engine's own, known once written)"
            for d, md in recorded.items()
        }
        for other in (ALL_DAYS[0], ALL_DAYS[2]):
            assert planned[other]["plan"] == "no change"
        assert day["plan"] == "changes"


def test_a_bad_batch_plans_its_refusal_and_changes_nothing(store: Store) -> None:
    """A batch with a stray row: the plan reports the refusal the publish then raises."""

    def stray(day: str) -> pa.Table:
        return pa.concat_tables([events(day), events(ALL_DAYS[2]).slice(0, 1)])

    with dg.DagsterInstance.ephemeral() as instance:
        run(store, instance, [events_asset("overwrite", events)], ALL_DAYS)
        tables, recorded = store.snapshot(), history(instance, "events")
        bad = events_asset("overwrite", stray)
        result = run(store, instance, [bad], [ALL_DAYS[1]], plan=True)
        assert result.success
        (planned,) = plans(result).values()
        assert planned["plan"] == "refused (StrayRowsError)"
        assert planned["refused"] is True
        assert (planned["rows_inserted"], planned["rows_deleted"]) == (0, 0)
        assert planned["rows_unchanged"] == 1000
        assert planned["fingerprint_after"] == planned["fingerprint_before"]
        assert store.snapshot() == tables
        assert history(instance, "events") == recorded
        with pytest.raises(ia.StrayRowsError) as refused:
            run(store, instance, [bad], [ALL_DAYS[1]])
        assert planned["refusal"] == str(refused.value)
        assert store.snapshot() == tables


def _plan_then_publish(
    store: Store, first: pa.Table, batch: pa.Table, write: ia.WriteSettings, day: str
) -> tuple[ia.PartitionPlan, list[tuple], list[tuple]]:
    """Publish ``first``, plan ``batch``, publish it: the plan, and the rows before and after."""
    window = ia.window_from_keys(DAILY, [day], write.asset)
    with store.open() as backend:
        ia.publish(backend, first, write, window, now=NOW)
    before = store.rows(write.table)
    with store.open() as backend:
        planned = ia.plan(backend, batch, write, window, now=NOW)
    assert store.rows(write.table) == before
    with store.open() as backend:
        published = ia.publish(backend, batch, write, window, now=NOW)
        predicts = backend.capabilities.plan_predicts_fingerprints
    if predicts:
        assert planned.total.fingerprint_after == published.fingerprint
    return planned.total, before, store.rows(write.table)


@pytest.mark.parametrize(
    ("stored_twice", "expected"),
    # Row 0 three times in the batch, row 1 twice, row 2 changed: (inserted, deleted, unchanged).
    [pytest.param(False, (4, 1, 19), id="batch"), pytest.param(True, (3, 1, 20), id="both")],
)
def test_rows_that_repeat_are_counted_copy_by_copy(
    store: Store, stored_twice: bool, expected: tuple[int, int, int]
) -> None:
    """An overwrite whose rows repeat, in the batch or on both sides: each copy is counted."""
    day = ALL_DAYS[1]
    rows = events(day, rows=20)
    first = pa.concat_tables([rows, rows.slice(0, 1)] if stored_twice else [rows])
    amounts = rows.column("amount").to_pylist()
    amounts[2] += 0.5
    changed = rows.set_column(2, "amount", pa.array(amounts))
    batch = pa.concat_tables([changed, rows.slice(0, 1), rows.slice(0, 1), rows.slice(1, 1)])
    write = settings("overwrite", EVENTS, table="repeats")
    planned, before, after = _plan_then_publish(store, first, batch, write, day)
    kept = sum((Counter(before) & Counter(after)).values())
    found = (planned.inserted, planned.deleted, planned.unchanged)
    assert found == (len(after) - kept, len(before) - kept, kept) == expected


def test_a_column_the_batch_adds_is_null_in_the_rows_an_upsert_keeps(store: Store) -> None:
    """An upsert adding a column: the rows it keeps gain a NULL there, as the plan foresaw."""
    day = ALL_DAYS[1]
    rows = events(day, rows=20)
    newer = rows.slice(0, 5).append_column("note", pa.array(["fixed"] * 5))
    write = settings(
        "merge",
        {**EVENTS, "delete_missing": False, "schema_evolution": "add_columns"},
        table="widened",
    )
    planned, before, after = _plan_then_publish(store, rows, newer, write, day)
    found = (planned.inserted, planned.updated, planned.deleted, planned.unchanged)
    assert found == (0, 5, 0, 15)
    assert (planned.rows_before, planned.rows_after) == (len(before), len(after)) == (20, 20)
