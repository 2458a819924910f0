"""What a new user meets first: one location name, dev data that fits the partitions, the pool."""

import tomllib
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

import dagster as dg
import pytest
import yaml
from e2e.readme import dagster_commands

from idem_assets import landing
from idem_assets.defs.partitions import DAILY, WAREHOUSE_POOL, WAREHOUSE_POOL_REASON
from idem_assets.defs.pools import ensure_warehouse_pool
from idem_assets.defs.resources import LandingZone

from .support import REPO, build_defs, run_dev_data

LOCATION = "idem_assets"
#: The UI plots the metadata of the last 120 partitions, counted back from now.
PLOTTED_DAYS = 120


def test_the_code_location_has_one_name_everywhere() -> None:
    workspace = yaml.safe_load((REPO / "workspace.yaml").read_text())
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())

    (entry,) = workspace["load_from"]
    assert entry["python_module"]["location_name"] == LOCATION
    assert pyproject["tool"]["dg"]["project"]["code_location_name"] == LOCATION
    assert pyproject["tool"]["dagster"]["code_location_name"] == LOCATION
    # A command naming the module creates a location called after it, which the daemon lacks.
    commands = dagster_commands()
    assert [c for c in commands if " -m " in c or "--module-name" in c] == []
    assert [c for c in commands if c.startswith("dagster ")] == [
        "dagster job backfill -w workspace.yaml -j taxi_daily --from 2026-01-01 --to 2026-01-05"
        " --noprompt",
    ]


def test_make_dev_writes_a_file_for_every_partition_and_today(tmp_path: Path) -> None:
    result = run_dev_data(tmp_path)

    today = datetime.now(UTC).date()
    written = landing.list_days(tmp_path)
    # Every partition has a file, so a first backfill of any range loads, and the last 120 days
    # the UI plots are days with data; today's file is for the schedule's next tick.
    assert [day.isoformat() for day in written] == [*DAILY.get_partition_keys(), today.isoformat()]
    assert len(result.stdout.splitlines()) == len(written) + 1
    assert len(DAILY.get_partition_keys()[-PLOTTED_DAYS:]) == min(PLOTTED_DAYS, len(written) - 1)
    # Run again, it keeps every file: a correction already delivered stays the latest version.
    landing.correct(tmp_path, date(2026, 1, 3))
    corrected = landing.read_day(tmp_path, date(2026, 1, 3))
    again = run_dev_data(tmp_path)
    assert again.stdout == f"kept {len(written)} day(s) that already had a file\n"
    assert landing.read_day(tmp_path, date(2026, 1, 3)) == corrected


def test_the_schedules_next_tick_has_a_file_after_make_dev(tmp_path: Path) -> None:
    run_dev_data(tmp_path)
    defs = build_defs()
    schedule = defs.resolve_schedule_def("taxi_daily_schedule")
    next_tick = datetime.combine(datetime.now(UTC).date() + timedelta(days=1), time(1), tzinfo=UTC)

    data = schedule.evaluate_tick(
        dg.build_schedule_context(
            scheduled_execution_time=next_tick,
            resources={"landing": LandingZone(root=str(tmp_path))},
            repository_def=defs.get_repository_def(),
        )
    )

    (request,) = data.run_requests or []
    assert request.partition_key == datetime.now(UTC).date().isoformat()
    delivered = landing.read_day(tmp_path, date.fromisoformat(request.partition_key))
    assert delivered.expected_rows == 1000


def test_the_job_says_why_the_pool_has_one_slot() -> None:
    defs = build_defs()
    job = defs.resolve_job_def("taxi_daily")

    assert WAREHOUSE_POOL_REASON in (job.description or "")
    assert "DuckDB lets one process at a time open the warehouse file" in WAREHOUSE_POOL_REASON


def _home(tmp_path: Path, dagster_yaml: str) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(dagster_yaml)
    return home


def test_loading_the_location_stores_the_pool_limit_of_dagster_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = _home(tmp_path, (REPO / "dagster.yaml").read_text())
    monkeypatch.setenv("DAGSTER_HOME", str(home))

    build_defs()

    with dg.DagsterInstance.get() as instance:
        limits = instance.event_log_storage.get_pool_limits()
        assert [(p.name, p.limit, p.from_default) for p in limits] == [(WAREHOUSE_POOL, 1, True)]
        # A limit someone set is theirs to keep.
        instance.event_log_storage.set_concurrency_slots(WAREHOUSE_POOL, 3)
        assert ensure_warehouse_pool(instance) == "kept"
        limits = instance.event_log_storage.get_pool_limits()
        assert [(p.name, p.limit, p.from_default) for p in limits] == [(WAREHOUSE_POOL, 3, False)]


def test_an_instance_without_a_default_limit_gets_one_slot(tmp_path: Path) -> None:
    home = _home(tmp_path, "telemetry:\n  enabled: false\n")
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        assert instance.global_op_concurrency_default_limit is None

        assert ensure_warehouse_pool(instance) == "set"

        limits = instance.event_log_storage.get_pool_limits()
        assert [(p.name, p.limit) for p in limits] == [(WAREHOUSE_POOL, 1)]
