"""The taxi code location on Iceberg by one setting: IDEM_WAREHOUSE=iceberg."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import idem_assets as ia
from idem_assets.defs.raw_trips import raw_trips
from idem_assets.defs.reconciliation import counts_per_day
from idem_assets.defs.revenue_running_total import revenue_running_total
from idem_assets.defs.stale_totals import stored_totals
from idem_assets.defs.warehouse import (
    ICEBERG_CATALOG,
    ICEBERG_WAREHOUSE,
    WAREHOUSE_ENV,
    warehouse_slots,
)
from tests.defs.support import REPO, ROWS, VENV_BIN, MakePipeline, days
from tests.defs.test_warehouse import run_the_chain_and_check_it

DAYS = days("2026-01-01", "2026-01-03")


def docs_bash(heading: str) -> str:
    """The one command of the first bash block under ``heading`` in docs/iceberg.md."""
    text = (REPO / "docs" / "iceberg.md").read_text()
    section = text.split(f"\n{heading}\n", 1)[1]
    (command,) = re.findall(r"^```bash\n(.*?)\n```", section, flags=re.M | re.S)[:1]
    return command


@pytest.mark.slow
@pytest.mark.full
def test_the_chain_runs_on_iceberg_by_one_setting(
    make_pipeline: MakePipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chain, its checks and totals on Iceberg tables of a SQLite catalog."""
    monkeypatch.setenv(WAREHOUSE_ENV, "iceberg")
    monkeypatch.setenv(ICEBERG_CATALOG, f"sqlite:///{tmp_path / 'catalog.db'}")
    monkeypatch.setenv(ICEBERG_WAREHOUSE, str(tmp_path / "warehouse"))
    pipeline = make_pipeline()
    pipeline.generate(DAYS[0], DAYS[-1])
    overwrite = pipeline.defs.resources["overwrite_io_manager"]
    assert isinstance(overwrite, ia.IcebergOverwriteIOManager)
    assert isinstance(pipeline.defs.resources["merge_io_manager"], ia.IcebergMergeIOManager)
    assert warehouse_slots() == 3

    run_the_chain_and_check_it(pipeline, overwrite)
    assert sorted(p.name for p in (tmp_path / "warehouse" / "main").iterdir()) == [
        "daily_zone_revenue",
        "raw_trips",
        "revenue_running_total",
        "trips",
    ]


@pytest.mark.slow
def test_the_docs_iceberg_switch_runs_as_printed(
    make_pipeline: MakePipeline, tmp_path: Path
) -> None:
    pipeline = make_pipeline()
    pipeline.generate(DAYS[0])
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    catalog = f"sqlite:///{tmp_path / 'catalog.db'}"
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "VIRTUAL_ENV": str(VENV_BIN.parent),
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        ICEBERG_CATALOG: catalog,
        ICEBERG_WAREHOUSE: str(tmp_path / "warehouse"),
    }
    env.pop(WAREHOUSE_ENV, None)
    command = docs_bash("## The code location on Iceberg")

    done = subprocess.run(
        ["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert not pipeline.database.exists()
    reader = ia.IcebergOverwriteIOManager(
        catalog_uri=catalog, warehouse=f"file://{tmp_path / 'warehouse'}"
    )
    assert counts_per_day(reader.read_asset(raw_trips), "pickup_at") == {DAYS[0]: ROWS}
    assert list(stored_totals(reader.read_asset(revenue_running_total))) == [DAYS[0]]
