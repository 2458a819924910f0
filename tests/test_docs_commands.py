"""Commands the README and docs/ print that no other test runs as printed: each run exactly so."""

import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_the_bad_input_catalogue_command_runs_as_printed() -> None:
    """docs/bad-inputs.md's command runs the whole catalogue and every case passes."""
    text = (REPO / "docs" / "bad-inputs.md").read_text()
    (command,) = re.findall(r"^```bash\n(.+)\n```", text, flags=re.MULTILINE)
    done = subprocess.run(
        ["bash", "-c", command], cwd=REPO, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = done.stdout.strip().splitlines()[-1]
    # Every case of the catalogue ran: nothing skipped, nothing failed.
    assert re.search(r"^\d+ passed", summary) and "skipped" not in summary, summary
    assert "failed" not in summary and "error" not in summary, summary


#: What Dagster prints for an API in beta or preview, or going away.
FRAMEWORK_WARNING = re.compile(r"\b\w*(Beta|Preview|Deprecation|Supersession)Warning\b")


@pytest.mark.slow
def test_make_demo_runs_as_printed_and_prints_no_framework_warning(tmp_path: Path) -> None:
    """The README's `make demo`, on folders of this test: it ends well and warns of nothing.

    The location's chosen preview APIs are silenced in idem_assets/demo.py (listed in
    docs/preview-apis.md); any other Beta, Preview or Deprecation warning fails this test.
    """
    text = (REPO / "README.md").read_text()
    block = text.split("\n## Two commands\n", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    (command,) = [line.split("#")[0].strip() for line in block.splitlines() if "make demo" in line]
    # As typed in a shell: under `make test` the outer make's variables would change its output.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    env |= {
        "DAGSTER_HOME": str(tmp_path / "dagster_home"),
        "IDEM_LANDING_DIR": str(tmp_path / "landing"),
        "IDEM_DUCKDB_PATH": str(tmp_path / "data" / "warehouse.duckdb"),
    }
    done = subprocess.run(
        ["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "-> the rerun replaced each day; nothing doubled." in done.stdout
    assert FRAMEWORK_WARNING.findall(output) == [], output[:3000]
