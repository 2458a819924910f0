"""Each landing-zone mess: refused by the right check of raw_trips, or absorbed by trips."""

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import pytest

from idem_assets import landing

from .support import (
    ROWS,
    Pipeline,
    check_evaluations,
    d,
    failed_checks,
    failure_text,
    materialized,
    metadata,
)

DAY = "2026-01-02"
BEFORE = "2026-01-01"


@dataclass(frozen=True)
class Mess:
    """A mess applied to DAY and what the audit of raw_trips must say about it."""

    apply: Callable[[Path, date], object]
    check: str
    failing: int
    #: Other raw_trips checks the same file fails too.
    also: frozenset[str] = frozenset()
    #: Row-level checks carry a sample of the failing rows.
    row_level: bool = True


MESSES = {
    # The manifest counts the stray row but the day holds one row fewer, so row_count fails too.
    "stray_row": Mess(
        lambda root, day: landing.add_stray_row(root, day, d(BEFORE)),
        "in_window",
        1,
        also=frozenset({"row_count"}),
    ),
    "bad_passengers": Mess(
        lambda root, day: landing.add_bad_passengers(root, day, count=2),
        "passenger_count_between_1_and_6",
        2,
    ),
    "stale": Mess(
        lambda root, day: landing.make_stale(root, day, hours=6),
        "pickup_at_freshness",
        1,
        row_level=False,
    ),
    "short_manifest": Mess(
        lambda root, day: landing.short_manifest(root, day, missing=1),
        "row_count",
        1,
        row_level=False,
    ),
}


@pytest.fixture
def loaded(pipeline: Pipeline) -> Pipeline:
    """Two good days, published."""
    pipeline.generate(BEFORE, DAY)
    pipeline.run_ok(BEFORE)
    pipeline.run_ok(DAY)
    return pipeline


@pytest.mark.parametrize("mess", MESSES.values(), ids=MESSES.keys())
def test_a_mess_is_refused_by_its_check_and_changes_nothing(loaded: Pipeline, mess: Mess) -> None:
    before = loaded.fingerprints()
    mess.apply(loaded.root, d(DAY))

    result = loaded.run(DAY)

    assert not result.success
    raw_failures = {name for asset, name in failed_checks(result) if asset == "raw_trips"}
    assert raw_failures == {mess.check, *mess.also}
    assert {asset for asset, _ in failed_checks(result)} == {"raw_trips"}
    evaluation = check_evaluations(result)[("raw_trips", mess.check)]
    assert evaluation.severity.value == "ERROR"
    assert evaluation.metadata["failing"].value == mess.failing
    if mess.row_level:
        assert "failing_sample" in evaluation.metadata
        assert evaluation.metadata["failing_sample"].value.startswith("| trip_id |")
    else:
        assert evaluation.metadata["detail"].value.startswith(f"{DAY}: failed")
    message = failure_text(result)
    assert "BlockingCheckError" in message
    assert f"  - {mess.check}: " in message
    # Nothing downstream ran, and readers keep the last good data in every table.
    assert materialized(result) == {}
    assert loaded.fingerprints() == before


def test_every_failed_blocking_check_has_a_failing_sample(loaded: Pipeline) -> None:
    mess = MESSES["stale"]
    mess.apply(loaded.root, d(DAY))
    result = loaded.run(DAY)
    assert "failing_sample" in check_evaluations(result)[("raw_trips", mess.check)].metadata


def test_stray_row_sample_names_the_stray_trip(loaded: Pipeline) -> None:
    MESSES["stray_row"].apply(loaded.root, d(DAY))
    result = loaded.run(DAY)
    in_window = check_evaluations(result)[("raw_trips", "in_window")]
    assert "T20260101-900001" in in_window.metadata["failing_sample"].value
    row_count = check_evaluations(result)[("raw_trips", "row_count")]
    assert row_count.partition == DAY
    assert [row_count.metadata[k].value for k in ("rows", "expected", "delta")] == [
        ROWS,
        ROWS + 1,
        -1,
    ]


def test_duplicates_warn_and_trips_keep_the_latest_version(loaded: Pipeline) -> None:
    landing.add_duplicates(loaded.root, d(DAY), count=3)
    delivered = landing.read_day(loaded.root, d(DAY)).table.to_pylist()
    latest: dict[str, dict] = {}
    for trip in delivered:
        if (
            trip["trip_id"] not in latest
            or trip["updated_at"] > latest[trip["trip_id"]]["updated_at"]
        ):
            latest[trip["trip_id"]] = trip
    resent = {i for i, n in Counter(t["trip_id"] for t in delivered).items() if n > 1}

    result = loaded.run_ok(DAY)

    assert failed_checks(result) == {("raw_trips", "trip_id_unique")}
    warning = check_evaluations(result)[("raw_trips", "trip_id_unique")]
    assert warning.severity.value == "WARN"
    assert warning.metadata["failing"].value == 3
    assert "failing_sample" in warning.metadata
    assert len(resent) == 3
    # raw_trips keeps the file as delivered; trips holds one row per trip, the latest version.
    assert loaded.rows_per_day("raw_trips")[DAY] == ROWS + 3
    assert loaded.rows_per_day("trips")[DAY] == ROWS
    rows = loaded.query(
        "SELECT trip_id, fare, tip, updated_at FROM trips"
        " WHERE pickup_at >= DATE '2026-01-02' AND pickup_at < DATE '2026-01-03'"
    )
    assert len({r[0] for r in rows}) == len(rows) == ROWS
    assert {r[0]: r[1:] for r in rows} == {
        i: (t["fare"], t["tip"], t["updated_at"]) for i, t in latest.items()
    }
    for trip_id in resent:
        versions = [t for t in delivered if t["trip_id"] == trip_id]
        assert versions[0]["fare"] != versions[1]["fare"]
    trips_md = metadata(result, "trips")
    assert (trips_md["rows_inserted"], trips_md["rows_updated"], trips_md["rows_deleted"]) == (
        0,
        ROWS,
        0,
    )


def test_missing_landing_file_fails_the_run_and_changes_nothing(loaded: Pipeline) -> None:
    before = loaded.fingerprints()
    landing.csv_path(loaded.root, d(DAY)).unlink()

    result = loaded.run(DAY)

    assert not result.success
    message = failure_text(result)
    assert "MissingLandingFileError" in message
    assert f"No landing file for {DAY}" in message
    assert materialized(result) == {}
    assert loaded.fingerprints() == before
