"""A pytest plugin that runs no test: each worker writes down the node ids it was given.

tests/test_workers.py runs `scripts/run_tests.sh -p worker_recorder` to see how `make test`
shares the suite between its workers, in seconds instead of the suite's minutes.
"""

import os
from pathlib import Path

import pytest

#: The folder the plugin writes one file per worker into, named after the worker.
RECORD_DIR_ENV = "IDEM_WORKER_RECORD_DIR"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> bool:
    """Write the test's node id to this worker's file instead of running it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    record = Path(os.environ[RECORD_DIR_ENV]) / worker
    with record.open("a") as file:
        file.write(f"{item.nodeid}\n")
    return True
