"""docs/rerun-plan.md: the 31-day backfill planned after a fix, run exactly as printed."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import dagster as dg
import duckdb
import pytest

import idem_assets as ia
from idem_assets.demo import TABLES

from .support import REPO, VENV_BIN

PAGE = REPO / "docs" / "rerun-plan.md"
HEADING = "## A 31-day backfill after a fix"
#: Where a Dagster log line starts: the table the plan logs ends there.
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4} - dagster - ")


def section_blocks(language: str) -> list[str]:
    """The section's fenced blocks of ``language``."""
    section = PAGE.read_text().split(f"\n{HEADING}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"^```{language}\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)


def last_plan_table(output: str) -> str:
    """The last "Plan of this run so far" table of a run's log."""
    lines = output.splitlines()
    starts = [i for i, line in enumerate(lines) if "Plan of this run so far:" in line]
    assert starts, output[-3000:]
    table = []
    for line in lines[starts[-1] + 1 :]:
        if LOG_LINE.match(line):
            break
        table.append(line)
    return "\n".join(table) + "\n"


def fingerprints(database: Path) -> dict[str, str | None]:
    """Every table of the warehouse and its fingerprint."""
    with duckdb.connect(str(database), read_only=True) as conn:
        names = conn.execute("SELECT schema_name, table_name FROM duckdb_tables()").fetchall()
        return {f"{s}.{t}": ia.table_fingerprint(conn, s, t) for s, t in names}


@pytest.mark.slow
@pytest.mark.full
def test_the_documented_backfill_plan_runs_as_printed_and_prints_its_table(
    tmp_path: Path,
) -> None:
    """The page's commands, as printed: the plan's table is the page's, and nothing changed."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    database = tmp_path / "data" / "warehouse.duckdb"
    env = {
        **os.environ,
        "IDEM_LANDING_DIR": str(tmp_path / "landing"),
        "IDEM_DUCKDB_PATH": str(database),
        "DAGSTER_HOME": str(home),
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    (block,) = section_blocks("bash")
    *loads, planned = [line for line in block.splitlines() if line.strip()]
    assert len(loads) == 3

    def sh(command: str) -> str:
        done = subprocess.run(
            ["bash", "-c", command],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-3000:]
        return output

    for command in loads:
        sh(command)
    before = fingerprints(database)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        recorded = {t: instance.get_latest_materialization_event(dg.AssetKey(t)) for t in TABLES}
    output = sh(planned)
    (printed,) = section_blocks("text")
    assert last_plan_table(output) == printed
    assert fingerprints(database) == before
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert {
            t: instance.get_latest_materialization_event(dg.AssetKey(t)) for t in TABLES
        } == recorded
