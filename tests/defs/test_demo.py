"""`make demo`: the whole story, end to end, through the dg CLI."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from idem_assets.worked_example import render_table, run_worked_example

from . import REPO, VENV_BIN


@pytest.mark.slow
def test_demo_runs_end_to_end_in_its_own_folders(tmp_path: Path) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    env = {
        **os.environ,
        "IDEM_LANDING_DIR": str(tmp_path / "landing"),
        "IDEM_DUCKDB_PATH": str(tmp_path / "data" / "warehouse.duckdb"),
        "DAGSTER_HOME": str(home),
        "VIRTUAL_ENV": str(VENV_BIN.parent),
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }

    proc = subprocess.run(
        [sys.executable, "-m", "idem_assets.demo"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )

    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "FAILED" not in output
    table = {
        m["pattern"]: (m["run1"], m["run2"])
        for m in re.finditer(
            r"^\s+(?P<pattern>append|overwrite|merge)\s+(?P<run1>[\d,]+)\s+(?P<run2>[\d,]+)\s*$",
            proc.stdout,
            re.MULTILINE,
        )
    }
    assert table == {
        "append": ("3,000", "6,000"),
        "overwrite": ("3,000", "3,000"),
        "merge": ("3,000", "3,000"),
    }
    assert f"Resetting demo data: {tmp_path / 'landing'}" in proc.stdout
    assert "The run was refused" in proc.stdout
    assert re.search(r"^\s+trips\s+2026-01-03\s+1,000\s+995\s*$", proc.stdout, re.MULTILINE)
    # The worked example's scratch database was written next to the warehouse and removed.
    assert not (tmp_path / "data" / "worked_example.duckdb").exists()


def test_worked_example_creates_its_folder_and_cleans_up(tmp_path: Path) -> None:
    database = tmp_path / "not_yet" / "worked_example.duckdb"

    rows = run_worked_example(str(database))

    assert rows == [("append", 3000, 6000), ("overwrite", 3000, 3000), ("merge", 3000, 3000)]
    assert "  append                   3,000         6,000" in render_table(rows)
    assert not database.exists()
