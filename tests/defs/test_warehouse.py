"""One setting chooses the warehouse: the chain, its checks and the report on Postgres or Delta."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import idem_assets as ia
from idem_assets.defs.daily_zone_revenue import daily_zone_revenue
from idem_assets.defs.raw_trips import raw_trips
from idem_assets.defs.reconciliation import RECONCILE_CHECK, counts_per_day
from idem_assets.defs.revenue_running_total import revenue_running_total
from idem_assets.defs.stale_totals import TOTALS_CHECK, revenue_per_day, stored_totals
from idem_assets.defs.warehouse import (
    DELTA_ROOT,
    SLOTS_ENV,
    WAREHOUSE_ENV,
    engine,
    warehouse_slots,
)
from idem_assets.lib.backends.postgres.backend import PostgresLocation
from tests.helpers import doc_bash

from .support import (
    REPO,
    ROWS,
    VENV_BIN,
    MakePipeline,
    Pipeline,
    check_evaluations,
    days,
    materialized,
)

DAYS = days("2026-01-01", "2026-01-03")


def run_the_chain_and_check_it(pipeline: Pipeline, overwrite: ia.IdempotentIOManager) -> None:
    """Day 1, then days 2-3 in one run, then day 2 again: checks pass, exact counts and totals."""
    pipeline.run_ok(DAYS[0])
    result = pipeline.run_ok(DAYS[1], DAYS[2])
    pipeline.run_ok(DAYS[1])

    assert materialized(result)["revenue_running_total"] == DAYS[1:]
    verdicts = check_evaluations(result)
    assert verdicts[("raw_trips", RECONCILE_CHECK)].passed
    assert verdicts[("revenue_running_total", TOTALS_CHECK)].passed
    # Nothing went to a DuckDB file.
    assert not pipeline.database.exists()
    counts = counts_per_day(overwrite.read_asset(raw_trips), "pickup_at")
    assert counts == dict.fromkeys(DAYS, ROWS)
    revenue = revenue_per_day(overwrite.read_asset(daily_zone_revenue))
    totals = stored_totals(overwrite.read_asset(revenue_running_total))
    assert totals == {
        DAYS[0]: revenue[DAYS[0]],
        DAYS[1]: revenue[DAYS[0]] + revenue[DAYS[1]],
        DAYS[2]: sum(revenue.values()),
    }


def run_documented_switch(
    doc: str, heading: str, tmp_path: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """The one command under ``heading`` of ``doc``, run as printed on a fresh instance."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    full = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "VIRTUAL_ENV": str(VENV_BIN.parent),
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        **env,
    }
    full.pop(WAREHOUSE_ENV, None)
    (command,) = doc_bash(heading, doc)
    done = subprocess.run(
        ["bash", "-c", command], cwd=REPO, env=full, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.fixture
def on_postgres(postgres_location: PostgresLocation, monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment a deployment sets to put the warehouse on PostgreSQL."""
    monkeypatch.setenv(WAREHOUSE_ENV, "postgres")
    monkeypatch.setenv("IDEM_PG_HOST", postgres_location.host)
    monkeypatch.setenv("IDEM_PG_PORT", str(postgres_location.port))
    monkeypatch.setenv("IDEM_PG_USER", postgres_location.user)
    monkeypatch.setenv("IDEM_PG_DB", postgres_location.database)
    monkeypatch.setenv("IDEM_PG_PASSWORD", str(postgres_location.password))


@pytest.mark.usefixtures("on_postgres")
def test_the_chain_runs_on_postgres_by_one_setting(make_pipeline: MakePipeline) -> None:
    pipeline = make_pipeline()
    pipeline.generate(DAYS[0], DAYS[-1])
    overwrite = pipeline.defs.resources["overwrite_io_manager"]
    assert isinstance(overwrite, ia.PostgresOverwriteIOManager)
    assert isinstance(pipeline.defs.resources["merge_io_manager"], ia.PostgresMergeIOManager)

    run_the_chain_and_check_it(pipeline, overwrite)


def test_the_chain_runs_on_delta_lake_by_one_setting(
    make_pipeline: MakePipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same chain on Delta tables: totals, reconciliation and the report read through them."""
    lake = tmp_path / "lake"
    monkeypatch.setenv(WAREHOUSE_ENV, "delta")
    monkeypatch.setenv(DELTA_ROOT, str(lake))
    pipeline = make_pipeline()
    pipeline.generate(DAYS[0], DAYS[-1])
    overwrite = pipeline.defs.resources["overwrite_io_manager"]
    assert isinstance(overwrite, ia.DeltaOverwriteIOManager)
    assert isinstance(pipeline.defs.resources["merge_io_manager"], ia.DeltaMergeIOManager)
    assert warehouse_slots() == 3

    run_the_chain_and_check_it(pipeline, overwrite)
    assert sorted(p.name for p in (lake / "main").iterdir()) == [
        "daily_zone_revenue",
        "raw_trips",
        "revenue_running_total",
        "trips",
    ]


def test_the_documented_postgres_switch_runs_as_printed(
    postgres_location: PostgresLocation, make_pipeline: MakePipeline, tmp_path: Path
) -> None:
    pipeline = make_pipeline()
    pipeline.generate(DAYS[0])
    login = {
        "IDEM_PG_HOST": postgres_location.host,
        "IDEM_PG_PORT": str(postgres_location.port),
        "IDEM_PG_USER": postgres_location.user,
        "IDEM_PG_DB": postgres_location.database,
        "IDEM_PG_PASSWORD": str(postgres_location.password),
    }

    done = run_documented_switch(
        "docs/postgres.md", "## The code location on PostgreSQL", tmp_path, login
    )

    assert str(postgres_location.password) not in done.stdout + done.stderr
    assert not pipeline.database.exists()
    reader = ia.PostgresOverwriteIOManager(
        host=postgres_location.host,
        port=postgres_location.port,
        user=postgres_location.user,
        database=postgres_location.database,
        password_env="IDEM_PG_PASSWORD",
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("IDEM_PG_PASSWORD", str(postgres_location.password))
        counts = counts_per_day(reader.read_asset(raw_trips), "pickup_at")
        totals = stored_totals(reader.read_asset(revenue_running_total))
    assert counts == {DAYS[0]: ROWS}
    assert list(totals) == [DAYS[0]]


def test_the_documented_delta_switch_runs_as_printed(
    make_pipeline: MakePipeline, tmp_path: Path
) -> None:
    pipeline = make_pipeline()
    pipeline.generate(DAYS[0])
    lake = tmp_path / "lake"

    run_documented_switch(
        "docs/delta.md",
        "## The code location on Delta Lake",
        tmp_path,
        {DELTA_ROOT: str(lake)},
    )

    assert not pipeline.database.exists()
    reader = ia.DeltaOverwriteIOManager(root=str(lake))
    assert counts_per_day(reader.read_asset(raw_trips), "pickup_at") == {DAYS[0]: ROWS}
    assert list(stored_totals(reader.read_asset(revenue_running_total))) == [DAYS[0]]


def test_duckdb_is_the_default_with_one_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WAREHOUSE_ENV, raising=False)
    monkeypatch.delenv(SLOTS_ENV, raising=False)
    assert (engine().name, warehouse_slots()) == ("duckdb", 1)
    monkeypatch.setenv(WAREHOUSE_ENV, "postgres")
    assert (engine().name, warehouse_slots()) == ("postgres", 3)
    monkeypatch.setenv(SLOTS_ENV, "5")
    assert warehouse_slots() == 5


@pytest.mark.parametrize(
    ("warehouse", "slots", "message"),
    [
        (
            "mysql",
            None,
            "IDEM_WAREHOUSE='mysql' names no warehouse engine. Nothing was changed. Fix: set"
            " IDEM_WAREHOUSE to one of ['delta', 'duckdb', 'iceberg', 'postgres', 'spark'] (unset"
            " means 'duckdb').",
        ),
        (
            "duckdb",
            "2",
            "IDEM_WAREHOUSE_SLOTS='2' is not a slot count the duckdb warehouse takes. Nothing"
            " was changed. Fix: set IDEM_WAREHOUSE_SLOTS to 1, or unset it for 1.",
        ),
        (
            "postgres",
            "0",
            "IDEM_WAREHOUSE_SLOTS='0' is not a slot count the postgres warehouse takes. Nothing"
            " was changed. Fix: set IDEM_WAREHOUSE_SLOTS to a whole number of at least 1, or"
            " unset it for 3.",
        ),
    ],
)
def test_a_wrong_setting_is_refused_with_its_fix(
    monkeypatch: pytest.MonkeyPatch, warehouse: str, slots: str | None, message: str
) -> None:
    monkeypatch.setenv(WAREHOUSE_ENV, warehouse)
    if slots is not None:
        monkeypatch.setenv(SLOTS_ENV, slots)
    with pytest.raises(ia.ConfigurationError) as refused:
        warehouse_slots()
    assert str(refused.value) == message
