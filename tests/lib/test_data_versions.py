"""Data version = content: identical reruns keep it and request nothing downstream."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import pytest
from dagster._core.definitions.data_version import StaleStatus
from dagster._utils.test.data_versions import get_stale_status_resolver

import idem_assets as ia

from .support import DAILY, DAYS, fingerprint, read, resources, run, trips_between

DAY = "2026-01-02"
VERSION_TAG = "dagster/data_version"


def assets(fares: dict[str, float]) -> list[Any]:
    """An audited upstream whose fares come from ``fares``, and a downstream on content change."""

    @ia.audited_asset(
        checks=[ia.not_null("trip_id")],
        partitions_def=DAILY,
        io_manager_key="overwrite_io_manager",
        metadata={"partition_expr": "pickup_at"},
    )
    def trips(context: dg.AssetExecutionContext) -> pd.DataFrame:
        """Trips of the window; ``fares['bump']`` is added to every fare."""
        tw = context.partition_time_window
        batch = trips_between(tw.start, tw.end)
        batch["fare"] = batch["fare"] + fares["bump"]
        return batch

    @dg.asset(
        partitions_def=DAILY,
        io_manager_key="overwrite_io_manager",
        metadata={"partition_expr": "pickup_at"},
        automation_condition=ia.content_changed(),
    )
    def busy_trips(trips: pd.DataFrame) -> pd.DataFrame:
        """Trips with four or more passengers."""
        return trips[trips["passenger_count"] >= 4]

    return [trips, busy_trips]


def version(instance: dg.DagsterInstance, asset: str, day: str) -> tuple[str, dict[str, Any]]:
    """The data version of the latest materialization of one day, and its metadata."""
    (record,) = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[day]), limit=1
    ).records
    materialization = record.asset_materialization
    assert materialization is not None
    metadata = {k: v.value for k, v in materialization.metadata.items()}
    return (record.event_log_entry.tags or {})[VERSION_TAG], metadata


def stale(instance: dg.DagsterInstance, defs: list[Any], asset: str, day: str) -> StaleStatus:
    """What the UI shows for a partition: FRESH, STALE or MISSING."""
    # Dagster's own test helper builds the resolver the webserver uses.
    return get_stale_status_resolver(instance, defs).get_status(dg.AssetKey(asset), day)


@pytest.fixture
def instance() -> Any:
    with dg.instance_for_test() as instance:
        yield instance


def test_the_data_version_is_the_published_fingerprint(
    tmp_path: Path, instance: dg.DagsterInstance
) -> None:
    run(assets({"bump": 0.0}), tmp_path / "w.duckdb", DAY, instance=instance)

    data_version, metadata = version(instance, "trips", DAY)
    assert data_version == metadata["fingerprint"]
    assert data_version.startswith("1000:")
    downstream_version, downstream = version(instance, "busy_trips", DAY)
    assert downstream_version == downstream["fingerprint"]


def test_an_identical_rerun_keeps_the_version_and_downstream_fresh_a_correction_does_not(
    tmp_path: Path, instance: dg.DagsterInstance
) -> None:
    db = tmp_path / "w.duckdb"
    fares = {"bump": 0.0}
    defs = assets(fares)
    run(defs, db, DAY, instance=instance)
    first, _ = version(instance, "trips", DAY)

    run(defs, db, DAY, selection=["trips"], instance=instance)
    assert version(instance, "trips", DAY)[0] == first
    assert stale(instance, defs, "busy_trips", DAY) == StaleStatus.FRESH

    fares["bump"] = 0.5
    run(defs, db, DAY, selection=["trips"], instance=instance)
    assert version(instance, "trips", DAY)[0] != first
    assert stale(instance, defs, "busy_trips", DAY) == StaleStatus.STALE


def test_content_changed_requests_only_the_corrected_day(
    tmp_path: Path, instance: dg.DagsterInstance
) -> None:
    db = tmp_path / "w.duckdb"
    fares = {"bump": 0.0}
    defs = assets(fares)
    for day in DAYS:
        run(defs, db, day, instance=instance)
    evaluate: Callable[[Any], Any] = lambda cursor: dg.evaluate_automation_conditions(  # noqa: E731
        defs=dg.Definitions(assets=defs, resources=resources(db)), instance=instance, cursor=cursor
    )
    ticked = evaluate(None)  # the first tick only sets the cursor
    assert ticked.total_requested == 0

    run(defs, db, DAY, selection=["trips"], instance=instance)
    ticked = evaluate(ticked.cursor)
    assert ticked.total_requested == 0  # identical rows: nothing to do downstream

    fares["bump"] = 0.5
    run(defs, db, DAY, selection=["trips"], instance=instance)
    ticked = evaluate(ticked.cursor)
    assert ticked.get_requested_partitions(dg.AssetKey("busy_trips")) == {DAY}
    assert ticked.total_requested == 1


def test_a_range_run_stamps_its_window_fingerprint_on_every_day(
    tmp_path: Path, instance: dg.DagsterInstance
) -> None:
    db = tmp_path / "w.duckdb"
    run(assets({"bump": 0.0}), db, partition_range=(DAYS[0], DAYS[-1]), instance=instance)
    stamped = {version(instance, "trips", day)[0] for day in DAYS}

    with read(db) as conn:
        window_fingerprint = fingerprint(conn, "trips", *DAYS)
    assert stamped == {window_fingerprint}
    assert window_fingerprint is not None and window_fingerprint.startswith("3000:")


def test_an_asset_that_reads_its_own_earlier_days_keeps_the_run_version_without_a_warning(
    tmp_path: Path, instance: dg.DagsterInstance
) -> None:
    @dg.asset(
        partitions_def=DAILY,
        io_manager_key="overwrite_io_manager",
        metadata={"partition_expr": "day"},
        ins={
            "previous": dg.AssetIn(
                "running_count", partition_mapping=dg.TimeWindowPartitionMapping(-1, -1)
            )
        },
        backfill_policy=dg.BackfillPolicy.single_run(),
    )
    def running_count(context: dg.AssetExecutionContext, previous: pd.DataFrame) -> pd.DataFrame:
        """One more than the day before, for each day of the run."""
        start = int(previous["n"].iloc[-1]) if len(previous) else 0
        days = pd.to_datetime(context.partition_keys)
        return pd.DataFrame({"day": days, "n": range(start + 1, start + 1 + len(days))})

    db = tmp_path / "w.duckdb"
    run([running_count], db, DAYS[0], instance=instance)
    result = run([running_count], db, partition_range=(DAYS[0], DAYS[-1]), instance=instance)

    mismatches = [
        entry.user_message
        for entry in instance.all_logs(result.run_id)
        if "Data version mismatch" in entry.user_message
    ]
    assert mismatches == []
    # Dagster's own version for every day of the range run: not the content's fingerprint.
    versions = {version(instance, "running_count", day)[0] for day in DAYS}
    assert len(versions) == 1
    assert not versions.pop().startswith("3:")
