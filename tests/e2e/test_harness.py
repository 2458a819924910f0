import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# Relative, because tests/ has no __init__.py: pytest imports this directory as `e2e`, while the
# code location below is loaded as `tests.e2e.toy_location` from the repository root.
from ports import bind_failed, every_other_pick

from .dagster_services import (
    DagsterServices,
    RunRecord,
    fast_dagster_yaml,
    max_overlap,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
TOY_MODULE = "tests.e2e.toy_location"
MAX_CONCURRENT_RUNS = 3
# Well below the stock 30 s so that each backfill needs seconds, not minutes.
BACKFILL_TICK_S = 1.0


@pytest.fixture
def services(tmp_path: Path) -> Iterator[DagsterServices]:
    services = DagsterServices(
        dagster_home=tmp_path / "dagster_home",
        dagster_yaml=fast_dagster_yaml(max_concurrent_runs=MAX_CONCURRENT_RUNS),
        module=TOY_MODULE,
        working_directory=REPO_ROOT,
        backfill_interval_seconds=BACKFILL_TICK_S,
    )
    services.start()
    try:
        yield services
    finally:
        services.stop()
    assert services.leftover_processes() == []


def test_services_whose_ports_are_taken_start_on_others_and_answer_as_themselves(
    services: DagsterServices, tmp_path: Path
) -> None:
    # The other worker's case: the port chosen for the code server, then the one chosen for the
    # webserver, is taken before they bind it, here by a running webserver that answers too.
    taken = services.port
    other = DagsterServices(
        dagster_home=tmp_path / "other_home",
        dagster_yaml=fast_dagster_yaml(),
        module=TOY_MODULE,
        workspace=REPO_ROOT / "deploy" / "workspace.yaml",
        code_server=True,
        working_directory=REPO_ROOT,
        backfill_interval_seconds=BACKFILL_TICK_S,
        choose_port=every_other_pick(taken),
    )
    with other:
        assert other.code_server_port is not None
        assert taken not in (other.code_server_port, other.port)
        assert other.process_env()["DAGSTER_GRPC_PORT"] == str(other.code_server_port)
        assert other.client.instance_home() == str(other.dagster_home)
        assert other.location_name == "idem_assets"
        assert services.client.instance_home() == str(services.dagster_home)
        # Each lost its first port, and said so.
        assert bind_failed(other.code_server_log.read_text())
        assert bind_failed(other.webserver_log.read_text())
    assert other.leftover_processes() == []


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


# The real location's backfills prove the queue's limit in make test (tests/e2e/test_backfills.py,
# phase 1); this toy version checks the harness itself.
@pytest.mark.full
def test_asset_backfill_respects_max_concurrent_runs(services: DagsterServices) -> None:
    partitions = [f"2026-01-0{day}" for day in range(1, 7)]

    backfill_id = services.client.launch_partition_backfill(
        ["toy_daily"], partitions, location=services.location_name, tags={"suite": "e2e"}
    )
    # A deadline, not a speed target: six runs two at a time took over 90 s on a loaded machine.
    result = services.client.wait_for_backfill(backfill_id, timeout_s=600)
    records = services.client.runs_for_backfill(backfill_id)

    assert result["status"] == "COMPLETED_SUCCESS"
    assert sorted(result["run_ids"]) == sorted(record.run_id for record in records)
    assert [record.status for record in records] == ["SUCCESS"] * 6
    assert sorted(record.partition or "" for record in records) == partitions
    assert all(record.tags["suite"] == "e2e" for record in records)
    assert all(
        record.start_time is not None
        and record.end_time is not None
        and record.creation_time <= record.start_time < record.end_time
        for record in records
    )
    assert max_overlap(records) <= MAX_CONCURRENT_RUNS


# `dagster job backfill` on the real location runs in make test (tests/e2e/test_backfills.py,
# phase 4); this toy version checks the harness itself.
@pytest.mark.full
def test_cli_job_backfill_runs_through_the_daemon(services: DagsterServices) -> None:
    completed = services.run_cli(
        [
            "job",
            "backfill",
            "-m",
            TOY_MODULE,
            "-j",
            "toy_job",
            "--partitions",
            "2026-01-01,2026-01-02",
            "--noprompt",
        ]
    )
    match = re.search(r"Launched backfill job `(\w+)`", completed.stdout)
    assert match, completed.stdout

    result = services.client.wait_for_backfill(match.group(1), timeout_s=600)
    records = services.client.runs_for_backfill(match.group(1))

    # The CLI queues the runs itself and marks its backfill COMPLETED at once; the queued run
    # coordinator daemon is what actually launches them.
    assert result["status"] == "COMPLETED"
    assert {record.partition: record.status for record in records} == {
        "2026-01-01": "SUCCESS",
        "2026-01-02": "SUCCESS",
    }


def test_interrupt_mid_run_kills_run_workers(tmp_path: Path) -> None:
    services = DagsterServices(
        dagster_home=tmp_path / "dagster_home",
        dagster_yaml=fast_dagster_yaml(max_concurrent_runs=MAX_CONCURRENT_RUNS),
        module=TOY_MODULE,
        working_directory=REPO_ROOT,
        backfill_interval_seconds=BACKFILL_TICK_S,
    )
    seen: list[int] = []
    with pytest.raises(KeyboardInterrupt), services:
        backfill_id = services.client.launch_partition_backfill(
            ["toy_daily"], ["2026-01-01", "2026-01-02"], location=services.location_name
        )
        records: list[RunRecord] = []
        deadline = time.monotonic() + 60
        while not any(record.status == "STARTED" for record in records):
            assert time.monotonic() < deadline, services.log_tails()
            time.sleep(0.2)
            records = services.client.runs_for_backfill(backfill_id)
        seen = services.leftover_processes()
        raise KeyboardInterrupt

    # Daemon, webserver, their two code servers and at least one run worker.
    assert len(seen) > 4
    assert [pid for pid in seen if _alive(pid)] == []
    assert services.leftover_processes() == []
