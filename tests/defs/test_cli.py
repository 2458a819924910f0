"""The command lines users and CI run, as subprocesses against the real code location."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .support import REPO, VENV_BIN, Pipeline, fingerprints, rows_per_day

pytestmark = pytest.mark.slow


def cli_env(pipeline: Pipeline, home: Path) -> dict[str, str]:
    """The environment of an activated venv, with this test's data and a fresh DAGSTER_HOME."""
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    return {
        **os.environ,
        "IDEM_LANDING_DIR": str(pipeline.root),
        "IDEM_DUCKDB_PATH": str(pipeline.database),
        "DAGSTER_HOME": str(home),
        "VIRTUAL_ENV": str(VENV_BIN.parent),
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run a command from the venv in the project root."""
    return subprocess.run(
        [str(VENV_BIN / args[0]), *args[1:]],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_definitions_validate_and_dg_check_defs(pipeline: Pipeline, tmp_path: Path) -> None:
    env = cli_env(pipeline, tmp_path / "dagster_home")

    validate = cli(env, "dagster", "definitions", "validate", "-w", "workspace.yaml")
    assert validate.returncode == 0, validate.stdout + validate.stderr
    assert "Validation successful" in validate.stdout + validate.stderr

    check = cli(env, "dg", "check", "defs")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "All definitions loaded successfully" in check.stdout + check.stderr
    # With the venv activated (as in CI), dg has nothing to warn about.
    assert "does not match the virtual environment" not in check.stdout + check.stderr


def test_asset_materialize_twice_keeps_the_row_counts(pipeline: Pipeline, tmp_path: Path) -> None:
    pipeline.generate("2026-01-01", "2026-01-03")
    env = cli_env(pipeline, tmp_path / "dagster_home")
    command = (
        "dagster",
        "asset",
        "materialize",
        "-m",
        "idem_assets.definitions",
        "--select",
        "raw_trips",
        "--partition",
        "2026-01-02",
    )

    first = cli(env, *command)
    assert first.returncode == 0, first.stdout + first.stderr
    counts, prints = rows_per_day(pipeline.database, "raw_trips"), fingerprints(pipeline.database)
    second = cli(env, *command)
    assert second.returncode == 0, second.stdout + second.stderr

    assert counts == rows_per_day(pipeline.database, "raw_trips") == {"2026-01-02": 200}
    assert fingerprints(pipeline.database) == prints


def test_asset_materialize_one_day_of_the_running_total_adds_the_revenue_before_it(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    pipeline.generate("2026-01-01", "2026-01-03")
    # The upstream days in another instance: the warehouse's rows prove they were written.
    pipeline.run_ok("2026-01-01", "2026-01-03", assets=["raw_trips", "trips", "daily_zone_revenue"])
    assert pipeline.fingerprints()["revenue_running_total"] is None
    env = cli_env(pipeline, tmp_path / "dagster_home")

    proc = cli(
        env,
        "dagster",
        "asset",
        "materialize",
        "-m",
        "idem_assets.definitions",
        "--select",
        "revenue_running_total",
        "--partition",
        "2026-01-03",
    )

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert rows_per_day(pipeline.database, "revenue_running_total") == {"2026-01-03": 1}
    assert pipeline.query("SELECT running_total FROM revenue_running_total") == pipeline.query(
        "SELECT sum(revenue) FROM daily_zone_revenue"
    )
