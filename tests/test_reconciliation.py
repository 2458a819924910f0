"""The post-backfill reconciliation of raw_trips with the landing manifests."""

from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import pytest

import idem_assets as ia
from idem_assets import landing
from idem_assets.defs.raw_trips import raw_trips
from idem_assets.defs.reconciliation import (
    RECONCILE_CHECK,
    DayCount,
    check_result,
    manifest_counts,
    reconcile,
    rows_per_day,
    rows_reconcile_with_manifests,
)
from idem_assets.defs.resources import LandingZone

FIRST = date(2026, 1, 1)
DAYS = [(FIRST + timedelta(days=i)).isoformat() for i in range(3)]
ROWS_PER_DAY = 1000


@pytest.fixture
def root(tmp_path: Path) -> Path:
    landing.generate(tmp_path / "landing", FIRST, FIRST + timedelta(days=2), rows=ROWS_PER_DAY)
    return tmp_path / "landing"


@pytest.fixture
def database(tmp_path: Path) -> Path:
    return tmp_path / "warehouse.duckdb"


@pytest.fixture
def resources(root: Path, database: Path) -> dict[str, Any]:
    return {
        "landing": LandingZone(root=str(root)),
        "overwrite_io_manager": ia.DuckDBOverwriteIOManager(database=str(database)),
    }


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as instance:
        yield instance


def load(
    day: str, resources: dict[str, Any], instance: dg.DagsterInstance
) -> dg.AssetCheckEvaluation:
    """Materialize one day of raw_trips with the check; return the check's evaluation."""
    result = dg.materialize(
        [raw_trips, rows_reconcile_with_manifests],
        partition_key=day,
        resources=resources,
        instance=instance,
    )
    assert result.success
    (evaluation,) = [
        e for e in result.get_asset_check_evaluations() if e.check_name == RECONCILE_CHECK
    ]
    return evaluation


def counts(database: Path) -> dict[str, int]:
    conn = duckdb.connect(str(database), read_only=True)
    try:
        return rows_per_day(conn, "main", "raw_trips", "pickup_at")
    finally:
        conn.close()


def values(evaluation: dg.AssetCheckEvaluation) -> dict[str, Any]:
    return {key: value.value for key, value in evaluation.metadata.items()}


def test_three_days_of_1000_rows_reconcile_to_3000_and_stay_there_on_rerun(
    resources: dict[str, Any], instance: dg.DagsterInstance, database: Path
) -> None:
    for day in DAYS:
        evaluation = load(day, resources, instance)
    evaluation = load(DAYS[1], resources, instance)

    assert evaluation.passed
    metadata = values(evaluation)
    assert metadata["expected_rows"] == metadata["actual_rows"] == 3000
    assert (metadata["days_ok"], metadata["days_short"], metadata["days_doubled"]) == (3, 0, 0)
    assert metadata["per_partition"] == {}
    assert counts(database) == dict.fromkeys(DAYS, 1000)


def test_a_doubled_backfill_of_6000_rows_fails_with_plus_1000_per_day(
    resources: dict[str, Any], instance: dg.DagsterInstance, database: Path, root: Path
) -> None:
    for day in DAYS:
        load(day, resources, instance)
    # The unsafe pattern the IO managers replace: the same three days appended a second time.
    conn = duckdb.connect(str(database))
    conn.execute("INSERT INTO main.raw_trips SELECT * FROM main.raw_trips")
    conn.close()

    result = rows_reconcile_with_manifests(
        dg.build_asset_check_context(instance=instance, resources=resources)
    )

    assert not result.passed
    assert result.severity == dg.AssetCheckSeverity.WARN
    metadata = {key: value.value for key, value in (result.metadata or {}).items()}
    assert (metadata["expected_rows"], metadata["actual_rows"]) == (3000, 6000)
    assert (metadata["days_ok"], metadata["days_doubled"]) == (0, 3)
    assert metadata["per_partition"] == {
        day: {"rows": 2000, "expected": 1000, "delta": 1000} for day in DAYS
    }
    for day in DAYS:
        assert f"| {day} | 1,000 | 2,000 | +1,000 | doubled |" in metadata["reconciliation"]
    assert reconcile(counts(database), manifest_counts(root)).counts()["doubled"] == 3


def test_short_empty_and_unlisted_days_fail_and_unloaded_days_do_not() -> None:
    expected = {"2026-01-01": 1000, "2026-01-02": 1000, "2026-01-03": 1000, "2026-01-04": 1000}
    actual = {"2026-01-01": 1000, "2026-01-02": 990, "2026-01-09": 5}
    # 2026-01-03 was published empty: Dagster recorded it, the warehouse holds nothing.
    result = reconcile(actual, expected, materialized=["2026-01-01", "2026-01-03"])

    assert not result.passed
    assert {d.day: (d.status, d.delta) for d in result.days} == {
        "2026-01-01": ("ok", 0),
        "2026-01-02": ("short", -10),
        "2026-01-03": ("short", -1000),
        "2026-01-09": ("no_manifest", None),
    }
    assert result.counts() == {"ok": 1, "short": 2, "doubled": 0, "no_manifest": 1}
    # 2026-01-04 has a manifest but was never loaded: a backfill may still be running.
    assert result.not_loaded == 1
    # Mismatches come first in the table.
    assert result.markdown().splitlines()[2].startswith("| 2026-01-02 | 1,000 | 990 | -10 |")


def test_nothing_loaded_passes_and_says_so(tmp_path: Path, root: Path) -> None:
    conn = duckdb.connect(str(tmp_path / "empty.duckdb"))
    try:
        actual = rows_per_day(conn, "main", "raw_trips", "pickup_at")
    finally:
        conn.close()
    result = reconcile(actual, manifest_counts(root))

    assert actual == {}
    assert result.passed
    assert result.not_loaded == 3
    assert check_result(result).metadata is not None


def test_day_count_status_boundaries() -> None:
    assert DayCount("2026-01-01", 1000, 1000).status == "ok"
    assert DayCount("2026-01-01", 1000, 999).status == "short"
    assert DayCount("2026-01-01", 1000, 1001).status == "doubled"
    assert DayCount("2026-01-01", None, 1).status == "no_manifest"


def test_manifest_rows_reads_only_the_manifest(root: Path) -> None:
    landing.csv_path(root, FIRST).unlink()

    assert landing.manifest_rows(root, FIRST) == ROWS_PER_DAY
    with pytest.raises(landing.ManifestMismatchError):
        landing.manifest_rows(root, FIRST - timedelta(days=1))
