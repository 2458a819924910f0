"""`make demo`: the whole story, end to end, through the dg CLI."""

import os
import re
import shutil
import subprocess
from datetime import UTC, date, datetime
from pathlib import Path

import dagster as dg
import pytest

from idem_assets import landing
from idem_assets.defs.partitions import DAILY
from idem_assets.worked_example import render_table, run_worked_example

from .support import REPO, TABLES, VENV_BIN, rows_per_day, run_dev_data

#: What Dagster prints for an API in beta or preview, or going away.
FRAMEWORK_WARNING = re.compile(r"\b\w*(Beta|Preview|Deprecation|Supersession)Warning\b")


def readme_command(name: str) -> str:
    """The line of the README's "Two commands" block that runs ``name``, without its comment."""
    text = (REPO / "README.md").read_text()
    block = text.split("\n## Two commands\n", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    (command,) = [line.split("#")[0].strip() for line in block.splitlines() if name in line]
    return command


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

    # The README's `make demo`, exactly as printed and as typed in a shell: under `make test`
    # the outer make's variables would change its output.
    for name in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS"):
        env.pop(name, None)
    proc = subprocess.run(
        ["bash", "-c", readme_command("make demo")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )

    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "FAILED" not in output
    # The location's chosen preview APIs are silenced in idem_assets/demo.py (listed in
    # docs/preview-apis.md); any other Beta, Preview or Deprecation warning fails here.
    assert FRAMEWORK_WARNING.findall(output) == [], output[:3000]
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

    # `make dev` next: a clean file for every day up to today, the demo's correction kept.
    run_dev_data(tmp_path / "landing")
    delivered = {
        d: landing.read_day(tmp_path / "landing", d)
        for d in landing.list_days(tmp_path / "landing")
    }
    today = datetime.now(UTC).date().isoformat()
    assert [day.isoformat() for day in delivered] == [*DAILY.get_partition_keys(), today]
    assert [(day.isoformat(), f.version) for day, f in delivered.items() if f.version != 1] == [
        ("2026-01-03", 2)
    ]
    for day, delivered_file in delivered.items():
        pickups = {t.date() for t in delivered_file.table.column("pickup_at").to_pylist()}
        assert pickups == {day}, f"{day} holds a stray trip"
    # The warehouse holds the three demo days in full, and the instance records exactly those.
    database = tmp_path / "data" / "warehouse.duckdb"
    assert rows_per_day(database, "raw_trips") == {
        "2026-01-01": 1000,
        "2026-01-02": 1000,
        "2026-01-03": 995,
    }
    with dg.DagsterInstance.from_config(str(home)) as instance:
        for table in TABLES:
            materialized = instance.get_materialized_partitions(dg.AssetKey(table))
            assert materialized == {"2026-01-01", "2026-01-02", "2026-01-03"}, table
    assert delivered[date(2026, 1, 2)].expected_rows == 1000


def test_worked_example_creates_its_folder_and_cleans_up(tmp_path: Path) -> None:
    database = tmp_path / "not_yet" / "worked_example.duckdb"

    rows = run_worked_example(str(database))

    assert rows == [("append", 3000, 6000), ("overwrite", 3000, 3000), ("merge", 3000, 3000)]
    assert "  append                   3,000         6,000" in render_table(rows)
    assert not database.exists()
