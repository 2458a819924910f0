"""Dagster's own IO manager suites, run as published and with ours swapped in (make peer-suites).

The command runs as docs/coming-from-dagster-io-managers.md prints it, and the counts that page
quotes are the ones it prints.
"""

import re
import shlex
import subprocess

import pytest

from tests.helpers import REPO_ROOT

PAGE = REPO_ROOT / "docs" / "coming-from-dagster-io-managers.md"
COMMAND = "make peer-suites"
ROW = re.compile(r"^(\w+_tests) [\d.]+ +(\d+) of (\d+) +(\d+) of (\d+)", re.MULTILINE)


@pytest.mark.full
def test_make_peer_suites_runs_as_printed_and_the_page_quotes_its_counts() -> None:
    assert f"```bash\n{COMMAND}\n```" in PAGE.read_text()
    done = subprocess.run(
        shlex.split(COMMAND), cwd=REPO_ROOT, capture_output=True, text=True, timeout=2400
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    counts = ROW.findall(done.stdout)
    assert [c[0] for c in counts] == [
        "dagster_duckdb_pandas_tests",
        "dagster_deltalake_tests",
        "dagster_deltalake_pandas_tests",
    ]
    text = PAGE.read_text()
    for suite, passed, ran, base_passed, base_ran in counts:
        row = f"| `{suite}` | {passed} of {ran} | {base_passed} of {base_ran} |"
        assert row in text, row
        assert base_passed == base_ran, suite
