"""The commands docs/code-location.md and docs/backfills.md print, verbatim, on a fresh instance.

The instance is started as `make dev` starts it: the daemon and webserver load workspace.yaml
with the repository's dagster.yaml unchanged, on a DAGSTER_HOME where nobody has set the
warehouse pool: what a new user has after `make dev`.
"""

import re
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import duckdb
import pytest

from idem_assets import landing
from idem_assets.defs.reconciliation import manifest_counts, reconcile, rows_per_day

from .dagster_services import (
    REPO_ROOT,
    DagsterServices,
    RunRecord,
    max_overlap,
)
from .readme import dagster_commands

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROWS_PER_DAY = 200
BACKFILL_DAYS = ["2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04", "2026-01-05"]
LAUNCHED = re.compile(r"Launched backfill job `(\w+)`")


@pytest.fixture
def landing_dir(tmp_path: Path) -> Path:
    root = tmp_path / "landing"
    landing.generate(root, date(2026, 1, 1), date(2026, 1, 31), rows=ROWS_PER_DAY)
    return root


@pytest.fixture
def services(tmp_path: Path, landing_dir: Path) -> Iterator[DagsterServices]:
    services = DagsterServices(
        dagster_home=tmp_path / "dagster_home",
        dagster_yaml=(REPO_ROOT / "dagster.yaml").read_text(),
        workspace=REPO_ROOT / "workspace.yaml",
        env={
            landing.LANDING_DIR_ENV: str(landing_dir),
            "IDEM_DUCKDB_PATH": str(tmp_path / "warehouse.duckdb"),
        },
    )
    services.start()
    try:
        yield services
    finally:
        services.stop()
    assert services.leftover_processes() == []


def test_documented_commands_run_verbatim_and_their_runs_succeed_one_at_a_time(
    services: DagsterServices, landing_dir: Path, tmp_path: Path
) -> None:
    assert services.location_name == "idem_assets"
    commands = dagster_commands()
    assert len(commands) == 5, commands
    backfills: list[list[RunRecord]] = []

    for command in commands:
        done = services.run_shell(command)
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"{command}\n{output}"
        # The CLI and the daemon agree on the location's name, so nothing warns about it.
        assert [line for line in output.splitlines() if "WARNING" in line.upper()] == [], output
        if command.startswith("dagster job backfill"):
            match = LAUNCHED.search(done.stdout)
            assert match, output
            backfills.append(services.wait_for_backfill_runs(match.group(1), len(BACKFILL_DAYS)))

    (records,) = backfills
    # The backfill's status says only that the runs were queued; the runs say what happened.
    assert {r.partition: r.status for r in records} == dict.fromkeys(BACKFILL_DAYS, "SUCCESS")
    # A fresh instance, nobody set the pool: still never two warehouse runs at once, oldest first.
    assert max_overlap(records) == 1
    assert [r.partition for r in sorted(records, key=lambda r: r.start_time or 0)] == BACKFILL_DAYS

    conn = duckdb.connect(str(tmp_path / "warehouse.duckdb"), read_only=True)
    try:
        loaded = rows_per_day(conn, "main", "raw_trips", "pickup_at")
        totals = rows_per_day(conn, "main", "revenue_running_total", "day")
    finally:
        conn.close()
    assert loaded == dict.fromkeys(BACKFILL_DAYS, ROWS_PER_DAY)
    assert reconcile(loaded, manifest_counts(landing_dir)).passed
    assert totals == dict.fromkeys(BACKFILL_DAYS, 1)

    # What docs/backfills.md warns about: under the module's name the backfill reads Completed,
    # while its run never started: the daemon has no location called idem_assets.definitions.
    done = services.run_shell(
        "dagster job backfill -m idem_assets.definitions -j taxi_daily"
        " --partitions 2026-01-05 --noprompt"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    match = LAUNCHED.search(done.stdout)
    assert match, done.stdout
    (record,) = services.wait_for_backfill_runs(match.group(1), 1)
    assert services.client.backfill_status(match.group(1))["status"] == "COMPLETED"
    assert record.status == "FAILURE"
    assert (
        "DagsterCodeLocationNotFoundError: Location idem_assets.definitions does not exist"
        in services.daemon_log.read_text()
    )
