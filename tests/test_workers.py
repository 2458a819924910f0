"""How `make test` shares the suite between its four workers (scripts/run_tests.sh)."""

import os
import subprocess
from pathlib import Path

from conftest import spark_test
from worker_recorder import RECORD_DIR_ENV

REPO_ROOT = Path(__file__).resolve().parents[1]
#: The units tests/conftest.py keeps whole, each on one worker: the Spark tests (tests/spark/ and
#: the Spark store's conformance cases, which the recorder run reaches through the replace
#: contract module), two groups of service tests (the demo test with the browser tests, whose
#: `make demo` folder it shares) and modules whose tests share one expensive module-scoped fixture.
WHOLE_UNITS = {
    "spark": ("tests/spark", "tests/conformance/test_replace_contract.py"),
    "browser": ("tests/browser", "tests/defs/test_demo.py"),
    "e2e": ("tests/e2e",),
    "benchmarks": ("tests/test_benchmarks_smoke.py",),
    "first hour": ("tests/defs/test_first_hour.py",),
}
#: The three largest units by number of tests, which xdist hands out first, one to each worker.
FIRST_HANDED = ("spark", "benchmarks", "e2e")


def in_unit(unit: str, node_id: str) -> bool:
    """Whether a node id is in ``unit``: Spark's by the scheduler's own rule, others by path."""
    return spark_test(node_id) if unit == "spark" else node_id.startswith(WHOLE_UNITS[unit])


def test_each_service_group_and_shared_setup_module_runs_whole_on_one_worker(
    tmp_path: Path,
) -> None:
    """Each unit's tests all go to one worker of its own; in-process tests are shared out beside."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT / "tests"),
        RECORD_DIR_ENV: str(tmp_path),
    }
    plugins = ["-p", "worker_recorder", "-p", "no:cacheprovider"]
    whole = [path for paths in WHOLE_UNITS.values() for path in paths]
    done = subprocess.run(
        ["bash", "scripts/run_tests.sh", *plugins, *whole],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    given = {record.name: record.read_text().splitlines() for record in tmp_path.iterdir()}
    assert sorted(given) == ["gw0", "gw1", "gw2", "gw3"]
    ran = [node_id for node_ids in given.values() for node_id in node_ids]
    owners: dict[str, str] = {}
    for unit in WHOLE_UNITS:
        assert any(in_unit(unit, node_id) for node_id in ran), unit
        workers = [w for w, node_ids in given.items() if any(in_unit(unit, n) for n in node_ids)]
        assert len(workers) == 1, (unit, workers)
        owners[unit] = workers[0]
    # The largest units are handed out first, one to each worker: none waits behind another.
    # Which worker takes which single test depends on timing: each runs once somewhere.
    assert len({owners[unit] for unit in FIRST_HANDED}) == len(FIRST_HANDED), owners
    others = [n for n in ran if "test_replace_contract" in n and "[spark" not in n]
    assert others and len(others) == len(set(others))
    assert len({w for w, node_ids in given.items() if set(others) & set(node_ids)}) > 1
