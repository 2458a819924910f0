"""SIGKILL a publishing process at random moments: main is at the old or the new snapshot.

Each trial starts a writer of one day, lets it load the catalog, then releases it and kills it
with SIGKILL after a uniform random delay in [0, 1.2 x one publish]. The day then holds exactly
the old or the new batch, never a mix, the other days are untouched, and after every trial the
next publish succeeds. Killed attempts leave files no metadata reaches; the sweep removes them
and the table reads the same after it. ``IDEM_FULL=1`` runs 20 trials per catalog.
"""

import json
import random
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from idem_assets.lib.backends.iceberg.backend import IcebergBackend
from idem_assets.lib.backends.iceberg.catalog import IcebergLocation
from idem_assets.lib.backends.iceberg.orphans import orphans, sweep_orphans
from tests.conformance.test_replace_contract import ALL_DAYS, events
from tests.iceberg.conftest import FULL, expected, fill, publish, stored
from tests.iceberg.writer import location_json

REPO = Path(__file__).resolve().parents[2]
SEED = 20261201
pytestmark = pytest.mark.slow


def writer(location: IcebergLocation, version: int) -> Any:
    """A writer of day 2 at ``version``, loaded and waiting for the word to publish."""
    job = {"mode": "overwrite", "day": ALL_DAYS[1], "version": version}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.iceberg.writer",
            location_json(location),
            json.dumps(job),
            "-",
            "0",
        ],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process


def go(process: Any) -> None:
    """Release the writer."""
    process.stdin.write("\n")
    process.stdin.flush()


@pytest.mark.parametrize(
    ("catalog", "trials"),
    [("sqlite", 20 if FULL else 2), ("postgres", 20 if FULL else 1)],
)
def test_a_killed_writer_leaves_main_at_the_old_or_the_new_snapshot(
    request: pytest.FixtureRequest, location: IcebergLocation, catalog: str, trials: int
) -> None:
    where = location if catalog == "sqlite" else request.getfixturevalue("postgres_catalog")
    fill(where)
    # One publish's time once the writer is loaded, to spread the kills over it.
    calibration = writer(where, 100)
    go(calibration)
    done = json.loads(calibration.communicate(timeout=120)[0].splitlines()[-1])
    assert done["outcome"] == "committed"
    duration = done["seconds"]
    rng = random.Random(SEED)
    outcomes = {"old": 0, "new": 0}
    version = 100
    for _trial in range(trials):
        before = stored(where)
        version += 1
        process = writer(where, version)
        delay = rng.uniform(0, 1.2 * duration)
        go(process)
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
        after = stored(where)
        new = expected(
            events(ALL_DAYS[0]), events(ALL_DAYS[1], version=version), events(ALL_DAYS[2])
        )
        assert after in (before, new), f"a mix after a kill at {delay:.3f} s"
        outcomes["old" if after == before else "new"] += 1
    # The next run succeeds, and the orphans of the killed attempts go without changing a row.
    publish(where, events(ALL_DAYS[1], version=999), "overwrite", ALL_DAYS[1])
    final = expected(events(ALL_DAYS[0]), events(ALL_DAYS[1], version=999), events(ALL_DAYS[2]))
    assert stored(where) == final
    with IcebergBackend(where) as backend:
        table = backend.catalog.load_table(("main", "events"))
        left = orphans(table, grace=timedelta(0))
        swept = sweep_orphans(table, grace=timedelta(0))
        assert swept == left and orphans(table, grace=timedelta(0)) == []
        # A file younger than the grace period is never swept: a publish may own it.
        assert sweep_orphans(table, dry_run=True) == []
    assert stored(where) == final
    print(
        f"{catalog}: {trials} kills over {duration:.2f} s publishes: {outcomes}, "
        f"{len(swept)} orphan files swept"
    )
    assert sum(outcomes.values()) == trials
