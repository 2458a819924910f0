"""How `make test` shares the suite between its two workers (scripts/run_tests.sh)."""

import os
import subprocess
from pathlib import Path

from worker_recorder import RECORD_DIR_ENV

REPO_ROOT = Path(__file__).resolve().parents[1]
SERVICE_PATHS = ("tests/e2e", "tests/browser")


def test_every_service_test_runs_on_one_worker_and_the_rest_beside_it(tmp_path: Path) -> None:
    """All tests/e2e and tests/browser tests go to one worker; in-process tests fill the other."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT / "tests"),
        RECORD_DIR_ENV: str(tmp_path),
    }
    plugins = ["-p", "worker_recorder", "-p", "no:cacheprovider"]
    paths = [*SERVICE_PATHS, "tests/lib/test_windows.py", "tests/lib/test_sql.py"]
    done = subprocess.run(
        ["bash", "scripts/run_tests.sh", *plugins, *paths],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    given = {record.name: record.read_text().split() for record in tmp_path.iterdir()}
    with_services = {
        worker
        for worker, node_ids in given.items()
        if any(node_id.startswith(SERVICE_PATHS) for node_id in node_ids)
    }
    assert sorted(given) == ["gw0", "gw1"]
    assert len(with_services) == 1
    # The other worker ran in-process tests meanwhile; the service worker may take some after.
    (other_worker,) = set(given) - with_services
    assert given[other_worker]
