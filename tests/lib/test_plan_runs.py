"""Plan runs in the Dagster layer: audited assets, the tags a plan needs, the run's summary."""

import json
import re
from pathlib import Path

import dagster as dg
import duckdb
import pytest

import idem_assets as ia
from idem_assets.lib.outbox.content import fingerprints_of

from .support import fingerprint, read, run, trips
from .test_audit import in_window_trips, pipeline, with_bad_passengers

DAY = "2026-01-02"


def plan_run(
    assets: list[dg.AssetsDefinition],
    db: Path,
    instance: dg.DagsterInstance,
    tags: dict[str, str],
    partition: str = DAY,
) -> dg.ExecuteInProcessResult:
    """One run of ``partition`` with ``tags`` (a plan's, or only some of them)."""
    return dg.materialize(
        assets,
        resources={
            "io_manager": ia.DuckDBOverwriteIOManager(database=str(db)),
            "overwrite_io_manager": ia.DuckDBOverwriteIOManager(database=str(db)),
        },
        partition_key=partition,
        tags=tags,
        instance=instance,
        raise_on_error=False,
    )


def observed(result: dg.ExecuteInProcessResult) -> dict[str, dict[str, object]]:
    """The run's plan observations, by asset, metadata values by name."""
    found = {}
    for event in result.all_events:
        if event.event_type == dg.DagsterEventType.ASSET_OBSERVATION:
            observation = event.asset_observation_data.asset_observation
            found[observation.asset_key.to_user_string()] = {
                k: getattr(v, "value", v) for k, v in observation.metadata.items()
            }
    return found


def test_a_blocking_check_failure_is_the_plan_s_refusal_not_the_run_s(tmp_path: Path) -> None:
    """An audited batch a blocking check refuses: the plan run succeeds and reports it."""
    db = tmp_path / "w.duckdb"
    source = {"bad": False}

    def batch(context: dg.AssetExecutionContext) -> object:
        return with_bad_passengers(context) if source["bad"] else in_window_trips(context)

    assets = pipeline(batch)
    with dg.DagsterInstance.ephemeral() as instance:
        run(assets, db, DAY, instance=instance)
        with read(db) as conn:
            before = fingerprint(conn)
        source["bad"] = True
        result = plan_run(assets, db, instance, dict(ia.PLAN_TAGS))
        assert result.success
        plans = observed(result)
        assert plans["trips"]["plan"] == "refused (BlockingCheckError)"
        refusal = str(plans["trips"]["refusal"])
        assert refusal.startswith(f"Asset 'trips', partition {DAY}: 1 blocking check(s) failed")
        assert "passenger_count_between_1_and_6: 3 failing row(s)" in refusal
        assert (plans["trips"]["rows_inserted"], plans["trips"]["rows_deleted"]) == (0, 0)
        # The downstream asset planned too, against the rows stored for trips.
        assert plans["busy_trips"]["planned_against"] == "stored rows of trips"
        assert plans["busy_trips"]["plan"] == "no change"
        with read(db) as conn:
            assert fingerprint(conn) == before
        assert result.get_asset_materialization_events() == []


def test_a_plan_without_the_defer_tag_is_refused_and_its_fix_runs(tmp_path: Path) -> None:
    """idem/plan alone would let Dagster record materializations: refused, with the tags to use."""
    db = tmp_path / "w.duckdb"
    assets = pipeline()
    with dg.DagsterInstance.ephemeral() as instance:
        run(assets, db, DAY, instance=instance)
        key = dg.AssetKey("trips")
        latest = instance.get_latest_materialization_event(key)
        result = plan_run(assets, db, instance, {ia.PLAN_TAG: "true"})
        assert not result.success
        failure = result.failure_data_for_node("trips")
        assert failure is not None and failure.error is not None and failure.error.cause
        message = failure.error.cause.message
        assert "Refused to plan asset 'trips', partition 2026-01-02" in message
        assert "Nothing was changed." in message
        assert instance.get_latest_materialization_event(key) == latest
        (printed,) = re.findall(r"--tags '(\{.*?\})'", message)
        fixed = plan_run(assets, db, instance, json.loads(printed))
        assert fixed.success
        assert observed(fixed)["trips"]["plan"] == "no change"
        assert instance.get_latest_materialization_event(key) == latest


def test_the_run_log_ends_with_the_whole_run_s_plan(tmp_path: Path) -> None:
    """Each planned step logs the plan so far: the last table holds every asset's partitions."""
    db = tmp_path / "w.duckdb"
    assets = pipeline()
    with dg.DagsterInstance.ephemeral() as instance:
        run(assets, db, DAY, instance=instance)
        result = plan_run(assets, db, instance, dict(ia.PLAN_TAGS))
        tables = [
            e.user_message
            for e in instance.all_logs(result.run_id)
            if e.user_message.startswith("Plan of this run so far:")
        ]
        assert len(tables) == 2
        lines = tables[-1].splitlines()
        assert lines[1].split() == [
            "asset",
            "partition",
            "plan",
            "inserted",
            "updated",
            "deleted",
            "unchanged",
            "fingerprint",
            "before",
            "fingerprint",
            "after",
        ]
        assert [line.split()[:3] for line in lines[3:]] == [
            ["trips", DAY, "no"],
            ["busy_trips", DAY, "no"],
        ]
        assert ia.run_plan(instance, result.run_id) == [
            tuple(re.split(r"\s{2,}", line)) for line in lines[3:]
        ]


@pytest.mark.parametrize("value", ["false", ""])
def test_a_run_not_tagged_as_a_plan_publishes(tmp_path: Path, value: str) -> None:
    """Only idem/plan=true plans: any other value publishes as always."""
    db = tmp_path / "w.duckdb"
    with dg.DagsterInstance.ephemeral() as instance:
        result = plan_run(pipeline(), db, instance, {ia.PLAN_TAG: value})
        assert result.success
        assert len(result.get_asset_materialization_events()) == 2


def test_a_plan_delivers_nothing_and_creates_no_ledger(tmp_path: Path) -> None:
    """The outbox in a plan run: revision 1 would be delivered; nothing sent, no ledger made."""
    sent: list[str] = []
    ledger = tmp_path / "outbox" / "ledger.sqlite"

    @dg.asset(partitions_def=dg.DailyPartitionsDefinition(start_date="2026-01-01"))
    def email(context: dg.AssetExecutionContext, outbox: ia.Outbox) -> dg.MaterializeResult:
        result = outbox.deliver(context, "email", "report", lambda d: sent.append(d.key))
        return dg.MaterializeResult(metadata={"outcome": result.outcome})

    with dg.DagsterInstance.ephemeral() as instance:
        result = dg.materialize(
            [email],
            resources={"outbox": ia.Outbox(ledger=str(ledger))},
            partition_key=DAY,
            tags=dict(ia.PLAN_TAGS),
            instance=instance,
        )
        assert result.success
        log = "\n".join(e.user_message for e in instance.all_logs(result.run_id))
    key = ia.idempotency_key("email", DAY, "email", 1, fingerprints_of("report")[0])
    assert f"Outbox (plan): would deliver email of asset 'email', partition {DAY}" in log
    assert f"revision 1, key {key}" in log
    assert sent == []
    assert not ledger.parent.exists()


def test_a_first_backfill_plans_its_downstream_against_the_planned_rows(tmp_path: Path) -> None:
    """No table yet: the upstream plans every row new, and its downstream plans on those rows."""
    db = tmp_path / "w.duckdb"
    with dg.DagsterInstance.ephemeral() as instance:
        result = plan_run(pipeline(), db, instance, dict(ia.PLAN_TAGS))
        assert result.success
        plans = observed(result)
    busy = int((trips(DAY)["passenger_count"] >= 4).sum())
    assert (plans["trips"]["rows_inserted"], plans["trips"]["fingerprint_before"]) == (
        1000,
        "(no table)",
    )
    assert plans["busy_trips"]["planned_against"] == "planned rows of trips"
    assert (plans["busy_trips"]["rows_inserted"], plans["busy_trips"]["rows_after"]) == (busy, busy)
    with duckdb.connect(str(db), read_only=True) as conn:
        assert conn.execute("SELECT count(*) FROM duckdb_tables()").fetchone() == (0,)
