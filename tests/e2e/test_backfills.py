"""Backfills of the real code location through the real daemon: limits, order, idempotency.

One DAGSTER_HOME and one warehouse are shared by the phases below, in this order, over 4 days
(three runs at once, the fourth waiting for a slot) under `make test` and 15 under
``IDEM_FULL=1`` (`make test-full`):

1. The days of raw_trips, one run per partition, with the warehouse pool raised to 3 so the
   run queue (max_concurrent_runs 3 and the backfill tag limit) is the binding limit.
2. The same backfill with the pool at its real limit 1: warehouse runs never overlap, and every
   partition's fingerprint is unchanged.
3. A chunked asset backfill of the whole group: one run for all four assets (multi_run(31) covers
   the days; the running total has its upstream's policy and reads no earlier day of itself).
4. ``dagster job backfill -j taxi_daily`` from the CLI: one run per day, oldest first.
5. ``dg launch --assets revenue_running_total --partition``: one day's total, in process.

After each phase the warehouse reconciles with the manifests and the fingerprints are unchanged.
"""

import json
import os
import shutil
import signal
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest
import yaml
from ports import open_files

import idem_assets as ia
from idem_assets import landing
from idem_assets.defs.partitions import DAILY, WAREHOUSE_POOL
from idem_assets.defs.reconciliation import (
    RECONCILE_CHECK,
    manifest_counts,
    reconcile,
    rows_per_day,
)
from idem_assets.defs.stale_totals import TOTALS_CHECK

# Relative, because tests/ has no __init__.py (see test_harness.py).
from .dagster_services import (
    DagsterGraphQLClient,
    DagsterServices,
    RunRecord,
    max_overlap,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKSPACE = "workspace.yaml"
JOB = "taxi_daily"
FIRST_DAY = date(2026, 1, 1)
#: Each one-run-per-partition phase starts a run worker per day: 4 days under the queue's limit
#: of 3 make one day wait for a slot, enough for overlap, order and reruns; the full count makes
#: five waves.
DAYS = 15 if os.environ.get("IDEM_FULL", "") not in ("", "0") else 4
ROWS_PER_DAY = 200
PARTITIONS = [(FIRST_DAY + timedelta(days=i)).isoformat() for i in range(DAYS)]
MAX_CONCURRENT_RUNS = 3
BACKFILL_TICK_S = 1.0
# The four tables and the column each is partitioned on.
TABLES = {
    "raw_trips": "pickup_at",
    "trips": "pickup_at",
    "daily_zone_revenue": "day",
    "revenue_running_total": "day",
}
GROUP = list(TABLES)
# The location's default executor, spelled out as the job backfill's run config.
IN_PROCESS = {"execution": {"config": {"in_process": {}}}}

_LAUNCH = """
mutation Launch($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId launchedRunIds }
    ... on PythonError { message stack }
    ... on Error { message }
  }
}
"""

_EVENTS = """
query Events($runId: ID!, $cursor: String) {
  logsForRun(runId: $runId, afterCursor: $cursor) {
    __typename
    ... on EventConnection {
      cursor
      hasMore
      events {
        __typename
        ... on MessageEvent { timestamp stepKey eventType }
        ... on AssetCheckEvaluationEvent { evaluation { checkName success } }
      }
    }
    ... on PythonError { message }
  }
}
"""

_RUN_ASSETS = """
query RunAssets($runId: ID!) {
  runOrError(runId: $runId) {
    __typename
    ... on Run { assetSelection { path } }
  }
}
"""


def instance_yaml() -> str:
    """The repository's dagster.yaml, with only the queue's polling made faster for the test."""
    config = yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())
    runs = config["concurrency"]["runs"]
    assert runs["max_concurrent_runs"] == MAX_CONCURRENT_RUNS
    assert config["concurrency"]["pools"] == {"default_limit": 1, "granularity": "run"}
    config["run_queue"] = {**config.get("run_queue", {}), "dequeue_interval_seconds": 1}
    return yaml.safe_dump(config, sort_keys=False)


@dataclass(frozen=True)
class RunEvents:
    """What one run's event log says about its timing, its steps and its checks."""

    starting: float | None
    steps: list[tuple[str, float, float]]
    checks: dict[str, bool]


def run_events(client: DagsterGraphQLClient, run_id: str) -> RunEvents:
    """Read a run's whole event log through GraphQL."""
    cursor: str | None = None
    starting: float | None = None
    started: dict[str, float] = {}
    steps: list[tuple[str, float, float]] = []
    checks: dict[str, bool] = {}
    while True:
        payload = client.execute(_EVENTS, {"runId": run_id, "cursor": cursor})["logsForRun"]
        assert payload["__typename"] == "EventConnection", payload
        for event in payload["events"]:
            if "evaluation" in event:
                checks[event["evaluation"]["checkName"]] = event["evaluation"]["success"]
            kind, step = event.get("eventType"), event.get("stepKey")
            if kind is None:
                continue
            at = float(event["timestamp"]) / 1000
            if kind == "RUN_STARTING":
                starting = at
            elif kind == "STEP_START":
                started[step] = at
            elif kind in ("STEP_SUCCESS", "STEP_FAILURE") and step in started:
                steps.append((step, started[step], at))
        cursor = payload["cursor"]
        if not payload["hasMore"]:
            return RunEvents(starting, steps, checks)


def in_progress(records: Sequence[RunRecord], events: Mapping[str, RunEvents]) -> list[RunRecord]:
    """Runs as the queue counts them: in progress from launch (STARTING), not from RUN_START."""
    return [
        RunRecord(
            r.run_id, r.status, r.tags, r.creation_time, events[r.run_id].starting, r.end_time
        )
        for r in records
    ]


def step_windows(events: Mapping[str, RunEvents]) -> list[RunRecord]:
    """Every step of every run as an interval; a step opens the warehouse file only inside it."""
    return [
        RunRecord(f"{run_id}/{step}", "", {}, start, start, end)
        for run_id, run in events.items()
        for step, start, end in run.steps
    ]


def run_assets(client: DagsterGraphQLClient, run_id: str) -> list[str]:
    """The asset keys a run materializes."""
    run = client.execute(_RUN_ASSETS, {"runId": run_id})["runOrError"]
    return sorted("/".join(key["path"]) for key in run["assetSelection"] or [])


def launch_one_run_per_partition(
    services: DagsterServices,
    assets: Sequence[str],
    partitions: Sequence[str],
    run_config: Mapping[str, Any] = IN_PROCESS,
) -> str:
    """Launch a job backfill of taxi_daily narrowed to ``assets`` as one run per partition.

    The UI's job backfill applies the job's backfill policy (its assets' strictest, 31 days) and
    would make one run of all the days. ``forceSynchronousSubmission`` makes the webserver create
    one run per partition, the same runs ``dagster job backfill`` creates, and queue them; the
    daemon's run queue launches them under dagster.yaml's limits. It records no backfill, so the
    runs are found by their dagster/backfill tag.
    """
    params = {
        "selector": {
            "partitionSetName": f"{JOB}_partition_set",
            "repositorySelector": {
                "repositoryName": "__repository__",
                "repositoryLocationName": services.location_name,
            },
        },
        "assetSelection": [{"path": key.split("/")} for key in assets],
        "partitionNames": list(partitions),
        "forceSynchronousSubmission": True,
        "runConfigData": dict(run_config),
    }
    payload = services.client.execute(_LAUNCH, {"params": params})["launchPartitionBackfill"]
    assert payload["__typename"] == "LaunchBackfillSuccess", payload
    assert len(payload["launchedRunIds"]) == len(partitions)
    return payload["backfillId"]


def set_pool_limit(services: DagsterServices, limit: int) -> None:
    """Set the warehouse pool's slots with the CLI, as an operator would."""
    services.run_cli(["instance", "concurrency", "set", WAREHOUSE_POOL, str(limit)])


def fingerprints(database: Path, tables: Sequence[str] = GROUP) -> dict[tuple[str, str], str]:
    """The fingerprint of every (table, day) for the test's days, read without a writer lock."""
    result: dict[tuple[str, str], str] = {}
    conn = duckdb.connect(str(database), read_only=True)
    try:
        for table in tables:
            for day in PARTITIONS:
                window = ia.window_from_keys(DAILY, [day], table)
                fp = ia.table_fingerprint(conn, "main", table, TABLES[table], window)
                assert fp is not None, f"table {table} does not exist"
                result[(table, day)] = fp
    finally:
        conn.close()
    return result


def assert_reconciles(database: Path, landing_dir: Path) -> None:
    """raw_trips holds each day's manifest rows, and nothing else."""
    conn = duckdb.connect(str(database), read_only=True)
    try:
        actual = rows_per_day(conn, "main", "raw_trips", "pickup_at")
    finally:
        conn.close()
    result = reconcile(actual, manifest_counts(landing_dir))
    assert result.passed, result.markdown()
    assert result.counts()["ok"] == DAYS
    assert sum(actual.values()) == DAYS * ROWS_PER_DAY


def assert_totals_are_sums(database: Path) -> None:
    """Every day's running total is the revenue of every day up to it, one row per day."""
    conn = duckdb.connect(str(database), read_only=True)
    try:
        stored = conn.sql(
            "SELECT day::VARCHAR, running_total FROM revenue_running_total ORDER BY day"
        ).fetchall()
        sums = conn.sql(
            "SELECT day::VARCHAR, sum(sum(revenue)) OVER (ORDER BY day)"
            " FROM daily_zone_revenue GROUP BY day ORDER BY day"
        ).fetchall()
    finally:
        conn.close()
    assert [day for day, _ in stored] == PARTITIONS
    assert stored == sums


def summary(
    records: Sequence[RunRecord], events: Mapping[str, RunEvents], launched_at: float
) -> dict[str, Any]:
    """Numbers worth printing for one backfill."""
    ends = [r.end_time for r in records if r.end_time is not None]
    return {
        "runs": len(records),
        "wall_s": round(max(ends) - launched_at, 1),
        "overlap_started": max_overlap(records),
        "overlap_in_progress": max_overlap(in_progress(records, events)),
        "overlap_steps": max_overlap(step_windows(events)),
    }


@pytest.fixture
def landing_dir(tmp_path: Path) -> Path:
    root = tmp_path / "landing"
    landing.generate(root, FIRST_DAY, FIRST_DAY + timedelta(days=DAYS - 1), rows=ROWS_PER_DAY)
    return root


@pytest.fixture
def services(tmp_path: Path, landing_dir: Path) -> Iterator[DagsterServices]:
    services = DagsterServices(
        dagster_home=tmp_path / "dagster_home",
        dagster_yaml=instance_yaml(),
        workspace=REPO_ROOT / WORKSPACE,
        env={
            "IDEM_LANDING_DIR": str(landing_dir),
            "IDEM_DUCKDB_PATH": str(tmp_path / "warehouse.duckdb"),
        },
        backfill_interval_seconds=BACKFILL_TICK_S,
    )
    services.start()
    try:
        yield services
    finally:
        services.stop()
    assert services.leftover_processes() == []


def test_backfills_run_under_the_limits_oldest_first_and_rerun_identically(
    services: DagsterServices, landing_dir: Path, tmp_path: Path
) -> None:
    client = services.client
    database = tmp_path / "warehouse.duckdb"
    measured: dict[str, Any] = {}

    # 1. Pool raised for this phase only, so the run queue is what limits the overlap.
    set_pool_limit(services, MAX_CONCURRENT_RUNS)
    launched_at = time.time()
    backfill_id = launch_one_run_per_partition(services, ["raw_trips"], PARTITIONS)
    records = services.wait_for_backfill_runs(backfill_id, DAYS, timeout_s=600)
    events = {r.run_id: run_events(client, r.run_id) for r in records}
    measured["per_partition_pool_3"] = summary(records, events, launched_at)

    assert [r.status for r in records] == ["SUCCESS"] * DAYS
    assert sorted(r.partition or "" for r in records) == PARTITIONS
    assert all(r.tags["dagster/backfill"] == backfill_id for r in records)
    # The queue starts several at once, and never more than its limit.
    assert 2 <= measured["per_partition_pool_3"]["overlap_in_progress"] <= MAX_CONCURRENT_RUNS
    assert_reconciles(database, landing_dir)
    first = fingerprints(database, ["raw_trips"])

    # 2. The real pool limit: the same backfill again, never two warehouse runs at once.
    set_pool_limit(services, 1)
    launched_at = time.time()
    backfill_id = launch_one_run_per_partition(services, ["raw_trips"], PARTITIONS)
    records = services.wait_for_backfill_runs(backfill_id, DAYS, timeout_s=600)
    events = {r.run_id: run_events(client, r.run_id) for r in records}
    measured["per_partition_pool_1"] = summary(records, events, launched_at)

    assert [r.status for r in records] == ["SUCCESS"] * DAYS
    assert measured["per_partition_pool_1"]["overlap_in_progress"] == 1
    assert measured["per_partition_pool_1"]["overlap_steps"] == 1
    # The queue is FIFO, so the runs start in the order the days were submitted.
    by_start = sorted(records, key=lambda r: r.start_time or 0)
    assert [r.partition for r in by_start] == PARTITIONS
    assert fingerprints(database, ["raw_trips"]) == first
    assert_reconciles(database, landing_dir)
    assert all(e.checks.get(RECONCILE_CHECK) for e in events.values()), events

    # 3. Chunked: the asset backfill uses each asset's policy.
    launched_at = time.time()
    backfill_id = client.launch_partition_backfill(
        GROUP, PARTITIONS, location=services.location_name
    )
    result = client.wait_for_backfill(backfill_id, timeout_s=300)
    records = client.runs_for_backfill(backfill_id)
    events = {r.run_id: run_events(client, r.run_id) for r in records}
    measured["chunked_group"] = summary(records, events, launched_at)

    assert result["status"] == "COMPLETED_SUCCESS", result
    assert {r.status for r in records} == {"SUCCESS"}
    # One run covers the days of the four assets: no second tick for the running total.
    (chunk,) = records
    assert run_assets(client, chunk.run_id) == sorted(GROUP)
    assert chunk.partition == f"{PARTITIONS[0]}...{PARTITIONS[-1]}"
    assert events[chunk.run_id].checks[TOTALS_CHECK] is True
    assert_totals_are_sums(database)
    assert measured["chunked_group"]["overlap_steps"] == 1
    everything = fingerprints(database)
    assert {k: v for k, v in everything.items() if k[0] == "raw_trips"} == first
    assert_reconciles(database, landing_dir)

    # 4. The CLI's job backfill: one run per day of the whole chain, launched oldest first.
    cli_days = PARTITIONS[-3:]
    launched_at = time.time()
    completed = services.run_cli(
        [
            "job",
            "backfill",
            "-w",
            WORKSPACE,
            "-j",
            JOB,
            "--partitions",
            ",".join(cli_days),
            "--noprompt",
        ]
    )
    backfill_id = completed.stdout.split("Launched backfill job `")[1].split("`")[0]
    records = services.wait_for_backfill_runs(backfill_id, len(cli_days), timeout_s=300)
    events = {r.run_id: run_events(client, r.run_id) for r in records}
    measured["cli_job_backfill"] = summary(records, events, launched_at)

    assert {r.partition: r.status for r in records} == dict.fromkeys(cli_days, "SUCCESS")
    by_start = sorted(records, key=lambda r: r.start_time or 0)
    assert [r.partition for r in by_start] == cli_days
    assert measured["cli_job_backfill"]["overlap_in_progress"] == 1
    assert fingerprints(database) == everything

    # 5. One day of revenue_running_total in one in-process run from the CLI.
    started = time.monotonic()
    launch = services.run_shell(
        f"dg launch --assets revenue_running_total --partition {PARTITIONS[-1]}", timeout_s=180
    )
    assert launch.returncode == 0, launch.stdout + launch.stderr
    measured["cli_running_total_day_s"] = round(time.monotonic() - started, 1)
    assert fingerprints(database) == everything
    assert_reconciles(database, landing_dir)

    print("\nbackfill measurements: " + json.dumps(measured, indent=2))


def _proc_parent(pid: int) -> int | None:
    """A process's parent pid from /proc, or None if it has gone or is a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = stat[stat.rfind(")") + 2 :].split()[:2]
    return None if state == "Z" else int(ppid)


def _live_pids() -> dict[int, int]:
    """Every live, non-zombie process and its parent."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (ppid := _proc_parent(int(entry))) is not None:
            found[int(entry)] = ppid
    return found


def _with_descendants(root: int) -> set[int]:
    """A process and every live process below it."""
    parents = _live_pids()
    tree = {root}
    grew = True
    while grew:
        below = {pid for pid, ppid in parents.items() if ppid in tree} - tree
        tree |= below
        grew = bool(below)
    return {pid for pid in tree if pid in parents}


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _readers_of(path: Path) -> set[int]:
    """Processes that hold ``path`` open."""
    return {pid for pid in _live_pids() if str(path) in open_files(pid)}


def _run_worker_of(pid: int) -> int:
    """The run worker above ``pid``: the child of the code server (`dagster api grpc`)."""
    while (parent := _proc_parent(pid)) is not None and b"grpc" not in _cmdline(parent):
        pid = parent
    assert parent is not None, f"process {pid} is not below a code server"
    return pid


def test_a_killed_run_worker_leaves_no_process_that_writes_afterwards(
    services: DagsterServices, landing_dir: Path, tmp_path: Path
) -> None:
    client = services.client
    database = tmp_path / "warehouse.duckdb"
    days = PARTITIONS[:3]
    backfill_id = client.launch_partition_backfill(
        ["raw_trips", "trips"], days, location=services.location_name
    )
    assert client.wait_for_backfill(backfill_id, timeout_s=300)["status"] == "COMPLETED_SUCCESS"
    before = fingerprints(database, ["raw_trips", "trips"])

    # The middle day arrives corrected, through a FIFO: the chunk's step blocks reading it until
    # the test writes, so the run worker is killed mid-chunk, before anything was published.
    corrected = tmp_path / "corrected"
    shutil.copytree(landing_dir, corrected)
    middle = date.fromisoformat(days[1])
    landing.correct(corrected, middle)
    shutil.copy(
        landing.manifest_path(corrected, middle), landing.manifest_path(landing_dir, middle)
    )
    fifo = landing.csv_path(landing_dir, middle)
    fifo.unlink()
    os.mkfifo(fifo)
    # Held open for writing, so a reader's open() returns and it blocks in read() until closed.
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)

    backfill_id = client.launch_partition_backfill(
        ["raw_trips", "trips"], days, location=services.location_name
    )
    deadline = time.monotonic() + 180
    while not (readers := _readers_of(fifo) - {os.getpid()}):
        assert time.monotonic() < deadline, services.log_tails()
        time.sleep(0.2)
    worker = _run_worker_of(next(iter(readers)))
    of_the_run = _with_descendants(worker)
    assert readers <= of_the_run, (readers, of_the_run)

    os.kill(worker, signal.SIGKILL)
    time.sleep(2)
    # A step process that outlived its worker would read the corrected day now and publish it.
    with os.fdopen(writer, "wb") as f:
        if _readers_of(fifo) - {os.getpid()}:
            f.write(landing.csv_path(corrected, middle).read_bytes())
    deadline = time.monotonic() + 20
    while (left := {pid for pid in of_the_run if _proc_parent(pid) is not None}) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.5)

    assert left == set(), [_cmdline(pid)[:200] for pid in left]
    assert fingerprints(database, ["raw_trips", "trips"]) == before
