"""Writers in separate processes, held at a barrier right before their commits, on one catalog.

Each race's writers all decide on one snapshot, then commit at once: the catalog's
compare-and-swap lets one through, and the others start over from the guards on its snapshot.
"""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import idem_assets as ia
from idem_assets.lib.backends.iceberg.backend import IcebergBackend
from idem_assets.lib.backends.iceberg.catalog import IcebergLocation
from tests.conformance.test_replace_contract import ALL_DAYS, EVENTS, events
from tests.helpers import NOW, settings, window
from tests.iceberg.conftest import FULL, expected, fill, stored
from tests.iceberg.writer import location_json

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def start_writer(
    location: IcebergLocation, job: dict[str, Any], barrier: Path, parties: int
) -> Any:
    args = [location_json(location), json.dumps(job), str(barrier), str(parties)]
    return subprocess.Popen(
        [sys.executable, "-m", "tests.iceberg.writer", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )


def outcome(process: Any) -> dict[str, Any]:
    out, _ = process.communicate(timeout=180)
    return json.loads(out.strip().splitlines()[-1])


def race(
    location: IcebergLocation, barrier: Path, jobs: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Writers that all decide on one snapshot, then commit at once."""
    processes = [start_writer(location, job, barrier, len(jobs)) for job in jobs]
    return [outcome(p) for p in processes]


@pytest.fixture(params=["sqlite", "postgres"] if FULL else ["sqlite"])
def catalog(request: pytest.FixtureRequest, location: IcebergLocation) -> IcebergLocation:
    """Each race on the SQLite file catalog, and under IDEM_FULL=1 on the PostgreSQL one.

    The everyday run races PostgreSQL-catalog writers in tests/conformance (test_races.py,
    test_first_writers.py).
    """
    if request.param == "sqlite":
        return location
    return request.getfixturevalue("postgres_catalog")


def test_writers_of_one_day_leave_exactly_one_batch(
    catalog: IcebergLocation, tmp_path: Path
) -> None:
    fill(catalog)
    jobs = [{"mode": "overwrite", "day": ALL_DAYS[1], "version": v} for v in (1, 2)]
    found = race(catalog, tmp_path / "barrier", jobs)
    assert all(f["outcome"] == "committed" for f in found), found
    # Both decided on one snapshot: the second commit lost and started over on the first's.
    assert sorted(f["attempts"] for f in found) == [1, 2]
    day = [r for r in stored(catalog) if r[1].date().isoformat() == ALL_DAYS[1]]
    assert day in (
        expected(events(ALL_DAYS[1], version=1)),
        expected(events(ALL_DAYS[1], version=2)),
    )
    assert len(stored(catalog)) == 3000


@pytest.mark.parametrize("existing", [True, False], ids=["table exists", "new table"])
def test_writers_of_different_days_both_commit(
    catalog: IcebergLocation, tmp_path: Path, existing: bool
) -> None:
    if existing:
        fill(catalog)
    jobs = [{"mode": "overwrite", "day": ALL_DAYS[i], "version": i} for i in (1, 2)]
    found = race(catalog, tmp_path / "barrier", jobs)
    assert [f["outcome"] for f in found] == ["committed", "committed"], found
    kept = [events(ALL_DAYS[0])] if existing else []
    assert stored(catalog) == expected(
        *kept, events(ALL_DAYS[1], version=1), events(ALL_DAYS[2], version=2)
    )
    with IcebergBackend(catalog) as backend:
        table = backend.catalog.load_table(("main", "events"))
    # Each commit is one snapshot: no writer's rows arrived through a second one.
    assert len(table.snapshots()) == (5 if existing else 2)


def test_merges_of_two_days_sharing_a_key_store_it_once(
    catalog: IcebergLocation, tmp_path: Path
) -> None:
    """pyiceberg's own retry would rebase the loser and store key 7 in both days."""
    fill(catalog, "merge")
    shared = [20260102_0007_00, 20260103_0007_00]
    jobs = [
        {"mode": "merge", "day": day, "version": 9, "ids": shared, "table": "events"}
        for day in ALL_DAYS[1:]
    ]
    found = race(catalog, tmp_path / "barrier", jobs)
    outcomes = sorted(f["outcome"] for f in found)
    assert outcomes == ["committed", "refused"], found
    refused = next(f for f in found if f["outcome"] == "refused")
    assert refused["error"] == "KeyOutsideWindowError", refused
    assert "Nothing was changed. Fix:" in refused["message"]
    ids = [r[0] for r in stored(catalog)]
    assert sorted(set(ids)) == sorted(ids), "a key stored twice"
    assert all(ids.count(k) == 1 for k in shared)


def test_a_commit_that_keeps_losing_is_refused_after_its_attempts(
    location: IcebergLocation, tmp_path: Path
) -> None:
    fill(location)
    others: list[int] = []

    def another_writer_commits_first(stage: str) -> None:
        if stage == "before_commit":
            others.append(len(others) + 10)
            job = {"mode": "overwrite", "day": ALL_DAYS[1], "version": others[-1]}
            found = outcome(start_writer(location, job, tmp_path / f"b{len(others)}", 1))
            assert found["outcome"] == "committed"

    with IcebergBackend(location) as backend, pytest.raises(ia.ConcurrentWriteError) as refused:
        ia.publish(
            backend,
            events(ALL_DAYS[1], version=1),
            settings("overwrite", EVENTS, table="events"),
            window(ALL_DAYS[1]),
            now=NOW,
            on_stage=another_writer_commits_first,
        )
    assert len(others) == 3
    text = str(refused.value)
    assert text.startswith(f"Refused to write asset 'events', partition {ALL_DAYS[1]}: 3 attempts")
    assert "Nothing was changed. Fix:" in text
    assert stored(location) == expected(
        events(ALL_DAYS[0]), events(ALL_DAYS[1], version=others[-1]), events(ALL_DAYS[2])
    )
