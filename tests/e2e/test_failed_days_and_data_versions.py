"""Through the real daemon: retry only what a chunk failed, and rerun nothing for the same rows.

1. A chunk of raw_trips with one bad day: the check records that day FAILED and the others
   SUCCEEDED, nothing of the chunk is published, and a backfill of the failed and missing days
   (what the UI's partition selection offers) reruns that chunk only.
2. With ``ia.content_changed()`` on the downstream assets and the automation daemon running, an
   identical rerun of raw_trips for a day starts no run; a corrected landing file starts one
   request for that day (one run: every asset has the same policy).
"""

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import pytest

from idem_assets import landing
from tests.lib.support import check_statuses

from .content_location import SENSOR
from .dagster_services import (
    TERMINAL_RUN_STATUSES,
    DagsterServices,
    ServicesError,
    fast_dagster_yaml,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
ROWS = 100
DAYS = [f"2026-01-0{d}" for d in range(1, 6)]
BAD_DAY = "2026-01-04"
BLOCKING_CHECK = "passenger_count_between_1_and_6"
GROUP = ["raw_trips", "trips", "daily_zone_revenue", "revenue_running_total"]
IN_PROCESS = json.dumps({"execution": {"config": {"in_process": {}}}})
RUN_TIMEOUT_S = 240.0

_RUNS = """
query Runs {
  runsOrError {
    __typename
    ... on Runs {
      results { runId status creationTime tags { key value } assetSelection { path } }
    }
  }
}
"""

_TICKS = """
query Ticks($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    __typename
    ... on Sensor { sensorState { status ticks(limit: 100) { status timestamp runIds } } }
  }
}
"""

_START_SENSOR = """
mutation Start($selector: SensorSelector!) {
  startSensor(sensorSelector: $selector) {
    __typename
    ... on Sensor { sensorState { status } }
    ... on PythonError { message }
  }
}
"""

_PARTITION_STATUSES = """
query Statuses($key: AssetKeyInput!) {
  assetNodes(assetKeys: [$key]) {
    assetPartitionStatuses {
      __typename
      ... on TimePartitionStatuses { ranges { status startKey endKey } }
    }
  }
}
"""


def landing_cli(root: Path, *args: str) -> None:
    """Run ``python -m idem_assets.landing`` as a user does."""
    subprocess.run(
        [sys.executable, "-m", "idem_assets.landing", *args, "--root", str(root)],
        check=True,
        capture_output=True,
    )


def start_services(tmp_path: Path, landing_dir: Path, module: str) -> DagsterServices:
    """Daemon and webserver on a fresh instance, the warehouse and landing zone under tmp_path."""
    services = DagsterServices(
        dagster_home=tmp_path / "dagster_home",
        dagster_yaml=fast_dagster_yaml(),
        module=module,
        working_directory=REPO_ROOT,
        env={
            landing.LANDING_DIR_ENV: str(landing_dir),
            "IDEM_DUCKDB_PATH": str(tmp_path / "warehouse.duckdb"),
        },
        backfill_interval_seconds=1.0,
    )
    services.start()
    return services


def all_runs(services: DagsterServices) -> list[dict[str, Any]]:
    """Every run of the instance, oldest first."""
    payload = services.client.execute(_RUNS)["runsOrError"]
    assert payload["__typename"] == "Runs", payload
    return sorted(payload["results"], key=lambda run: run["creationTime"])


def assets_of(run: dict[str, Any]) -> list[str]:
    """The asset keys a run materializes."""
    return sorted("/".join(key["path"]) for key in run["assetSelection"] or [])


def partition_ranges(services: DagsterServices, asset: str) -> list[tuple[str, str, str]]:
    """(status, first day, last day) of an asset's partitions as the partitions view shows them."""
    nodes = services.client.execute(_PARTITION_STATUSES, {"key": {"path": [asset]}})["assetNodes"]
    ranges = nodes[0]["assetPartitionStatuses"]["ranges"]
    return [(r["status"], r["startKey"], r["endKey"]) for r in ranges]


def instance_of(services: DagsterServices) -> dg.DagsterInstance:
    """The daemon's instance, read from the test process."""
    return dg.DagsterInstance.from_config(str(services.dagster_home))


def rows_per_day(database: Path, table: str) -> dict[str, int]:
    """Rows of each day in ``table``, read without a writer lock."""
    conn = duckdb.connect(str(database), read_only=True)
    try:
        found = conn.execute(
            f"SELECT CAST(pickup_at AS DATE)::VARCHAR, count(*) FROM {table} GROUP BY ALL"
        ).fetchall()
    finally:
        conn.close()
    return dict(sorted(found))


@pytest.fixture
def landing_dir(tmp_path: Path) -> Path:
    root = tmp_path / "landing"
    landing_cli(root, "generate", "--start", DAYS[0], "--end", DAYS[-1], "--rows", str(ROWS))
    return root


# 1. Retry only what failed ------------------------------------------------------------------------


@pytest.fixture
def taxi(tmp_path: Path, landing_dir: Path) -> Iterator[DagsterServices]:
    services = start_services(tmp_path, landing_dir, "idem_assets.definitions")
    try:
        yield services
    finally:
        services.stop()
    assert services.leftover_processes() == []


def backfill(services: DagsterServices, days: list[str]) -> dict[str, Any]:
    """An asset backfill of raw_trips, as the UI launches it, run to the end."""
    backfill_id = services.client.launch_partition_backfill(
        ["raw_trips"], days, location=services.location_name
    )
    return services.client.wait_for_backfill(backfill_id, timeout_s=RUN_TIMEOUT_S)


# make test proves this chunk's story through the UI (tests/browser/test_check_partitions.py:
# the bad day red, the failed chunk retried as one run); this GraphQL version adds the per-day
# statuses of every check and that no good day ran twice, at the cost of its own services.
@pytest.mark.full
def test_a_failed_chunk_shows_its_bad_day_and_a_retry_reruns_only_that_chunk(
    taxi: DagsterServices, landing_dir: Path, tmp_path: Path
) -> None:
    landing_cli(landing_dir, "mess", "--day", BAD_DAY, "--bad-passengers", "3")
    first = backfill(taxi, DAYS[:2])
    assert first["status"] == "COMPLETED_SUCCESS"

    failed = backfill(taxi, DAYS[2:])

    # One chunk (multi_run(31)) for the three days; it failed on the bad day alone.
    assert len(failed["run_ids"]) == 1
    with instance_of(taxi) as instance:
        assert check_statuses(instance, "raw_trips", BLOCKING_CHECK, failed["run_ids"][0]) == {
            "2026-01-03": "SUCCEEDED",
            "2026-01-04": "FAILED",
            "2026-01-05": "SUCCEEDED",
        }
        for check in ("row_count", "in_window", "pickup_at_freshness"):
            assert set(check_statuses(instance, "raw_trips", check).values()) == {"SUCCEEDED"}
    # The chunk was refused before its write, so Dagster lists all three days as failed.
    ranges = partition_ranges(taxi, "raw_trips")
    assert ranges == [
        ("MATERIALIZED", "2026-01-01", "2026-01-02"),
        ("FAILED", "2026-01-03", "2026-01-05"),
    ]
    assert rows_per_day(tmp_path / "warehouse.duckdb", "raw_trips") == {
        "2026-01-01": ROWS,
        "2026-01-02": ROWS,
    }

    # Fix the input (the source resends the day), then backfill the failed and missing days.
    landing_cli(landing_dir, "generate", "--start", BAD_DAY, "--end", BAD_DAY, "--rows", str(ROWS))
    failed_days = [
        d for d in DAYS if any(s != "MATERIALIZED" and a <= d <= b for s, a, b in ranges)
    ]
    retry = backfill(taxi, failed_days)

    assert retry["status"] == "COMPLETED_SUCCESS"
    assert len(retry["run_ids"]) == 1
    assert partition_ranges(taxi, "raw_trips") == [("MATERIALIZED", "2026-01-01", "2026-01-05")]
    with instance_of(taxi) as instance:
        assert check_statuses(instance, "raw_trips", BLOCKING_CHECK, retry["run_ids"][0]) == (
            dict.fromkeys(failed_days, "SUCCEEDED")
        )
        # The good days of the first backfill were not run again.
        per_day = instance.fetch_materializations(dg.AssetKey("raw_trips"), limit=100).records
        runs_per_day: dict[str, int] = {}
        for record in per_day:
            key = record.partition_key or ""
            runs_per_day[key] = runs_per_day.get(key, 0) + 1
        assert runs_per_day == dict.fromkeys(DAYS, 1)
    assert rows_per_day(tmp_path / "warehouse.duckdb", "raw_trips") == dict.fromkeys(DAYS, ROWS)


# 2. Data versions and content_changed() ---------------------------------------------------------


@pytest.fixture
def automated(tmp_path: Path, landing_dir: Path) -> Iterator[DagsterServices]:
    services = start_services(tmp_path, landing_dir, "tests.e2e.content_location")
    try:
        services.client.execute("mutation { setNuxSeen }")
        yield services
    finally:
        services.stop()
    assert services.leftover_processes() == []


def materialize(services: DagsterServices, assets: list[str], day: str) -> None:
    """``dagster asset materialize`` against the services' instance, in the CLI's process."""
    services.run_cli(
        [
            "asset",
            "materialize",
            "-m",
            "tests.e2e.content_location",
            "--select",
            ",".join(assets),
            "--partition",
            day,
            "--config-json",
            IN_PROCESS,
        ],
        timeout_s=RUN_TIMEOUT_S,
    )


def sensor_selector(services: DagsterServices) -> dict[str, str]:
    """The GraphQL selector of the automation sensor."""
    return {
        "repositoryName": "__repository__",
        "repositoryLocationName": services.location_name,
        "sensorName": SENSOR,
    }


def start_automation(services: DagsterServices) -> None:
    """Turn the automation sensor on, as the UI's toggle does."""
    payload = services.client.execute(_START_SENSOR, {"selector": sensor_selector(services)})
    assert payload["startSensor"]["__typename"] == "Sensor", payload


def ticks(services: DagsterServices) -> list[dict[str, Any]]:
    """The automation sensor's finished ticks, oldest first."""
    selector = sensor_selector(services)
    payload = services.client.execute(_TICKS, {"selector": selector})["sensorOrError"]
    assert payload["__typename"] == "Sensor", payload
    state = payload["sensorState"]
    assert state["status"] == "RUNNING"
    done = [t for t in state["ticks"] if t["status"] in ("SUCCESS", "SKIPPED", "FAILURE")]
    return sorted(done, key=lambda t: t["timestamp"])


def wait_for_ticks_after(services: DagsterServices, moment: float, count: int) -> None:
    """Wait until the sensor has finished ``count`` ticks that started after ``moment``."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        done = [t for t in ticks(services) if t["timestamp"] > moment]
        if any(t["status"] == "FAILURE" for t in done):
            raise ServicesError(f"The automation tick failed\n{services.log_tails()}")
        if len(done) >= count:
            return
        time.sleep(1)
    raise ServicesError(f"Fewer than {count} automation ticks\n{services.log_tails()}")


def wait_for_runs_to_finish(services: DagsterServices) -> list[dict[str, Any]]:
    """Wait until no run of the instance is queued or in progress; return them all."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        runs = all_runs(services)
        if all(run["status"] in TERMINAL_RUN_STATUSES for run in runs):
            return runs
        time.sleep(1)
    raise ServicesError(f"Runs still in progress\n{services.log_tails()}")


def settle(services: DagsterServices) -> list[dict[str, Any]]:
    """Two automation ticks after now, and every run they started finished."""
    wait_for_ticks_after(services, time.time(), 2)
    wait_for_runs_to_finish(services)
    wait_for_ticks_after(services, time.time(), 1)
    return wait_for_runs_to_finish(services)


def test_an_identical_rerun_starts_nothing_downstream_and_a_correction_one_request(
    automated: DagsterServices, landing_dir: Path, tmp_path: Path
) -> None:
    day = DAYS[1]
    for loaded in DAYS[:2]:
        materialize(automated, GROUP, loaded)
    # Automation is turned on after the initial load; its first tick only records where it is.
    start_automation(automated)
    before = settle(automated)
    assert [assets_of(run) for run in before] == [sorted(GROUP)] * 2

    materialize(automated, ["raw_trips"], day)
    identical = settle(automated)

    assert [assets_of(run) for run in identical[len(before) :]] == [["raw_trips"]]

    landing_cli(landing_dir, "mess", "--day", day, "--correct")
    materialize(automated, ["raw_trips"], day)
    corrected = settle(automated)

    new = corrected[len(identical) :]
    assert assets_of(new[0]) == ["raw_trips"]
    automation = new[1:]
    tags = [{t["key"]: t["value"] for t in run["tags"]} for run in automation]
    # One request of one tick, for the corrected day only, and one run: every asset has the same
    # policy and the running total reads no earlier day of itself, so no backfill is needed.
    assert all(t["dagster/from_automation_condition"] == "true" for t in tags)
    assert len({t["dagster/tick"] for t in tags}) == 1
    assert [assets_of(run) for run in automation] == [
        ["daily_zone_revenue", "revenue_running_total", "trips"]
    ]
    assert [
        t.get("dagster/partition")
        or f"{t['dagster/asset_partition_range_start']}...{t['dagster/asset_partition_range_end']}"
        for t in tags
    ] in ([day], [f"{day}...{day}"])
    assert [run["status"] for run in automation] == ["SUCCESS"]
    assert rows_per_day(tmp_path / "warehouse.duckdb", "trips")[day] == ROWS - 5
    assert rows_per_day(tmp_path / "warehouse.duckdb", "raw_trips")[day] == ROWS - 5
