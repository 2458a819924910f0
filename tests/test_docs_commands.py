"""Commands the README and docs/ print that no other test runs as printed: each run exactly so."""

import re
import subprocess
from pathlib import Path

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
