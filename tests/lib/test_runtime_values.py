"""Run-time values: load stamps and random uuids are refused, source facts are not."""

import hashlib
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import pyarrow as pa
import pytest

import idem_assets as ia
from idem_assets.lib.write.runtime_values import check_runtime_values

from .support import (
    DAYS,
    NOW,
    TRIPS_METADATA,
    fingerprint,
    read,
    rows,
    run,
    trips,
    trips_asset,
    window,
)

DAY = DAYS[1]


@pytest.fixture
def new_york_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local time zone is New York, so naive now() is five hours behind UTC."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def publish_with(
    tmp_path: Path, extra: Callable[[pd.DataFrame], pd.DataFrame], n: int = 1000
) -> tuple[Path, dg.ExecuteInProcessResult]:
    """Merge ``extra(trips of DAY)`` through the IO manager, at the real wall-clock time."""

    def source(context: dg.AssetExecutionContext) -> pd.DataFrame:
        return extra(trips(context.partition_key, n))

    db = tmp_path / "w.duckdb"
    return db, run([trips_asset("merge_io_manager", TRIPS_METADATA, source)], db, DAY)


def refused(tmp_path: Path, extra: Callable[[pd.DataFrame], pd.DataFrame], n: int = 1000) -> str:
    with pytest.raises(ia.RuntimeValueError) as error:
        publish_with(tmp_path, extra, n)
    with read(tmp_path / "w.duckdb") as conn:
        assert fingerprint(conn) is None
    return str(error.value)


NAIVE_NOW: dict[str, Callable[[], Any]] = {
    "datetime.now()": datetime.now,
    "pd.Timestamp.now()": pd.Timestamp.now,
    "datetime.now(UTC) made naive": lambda: datetime.now(UTC).replace(tzinfo=None),
}


@pytest.mark.parametrize("stamp", NAIVE_NOW.values(), ids=NAIVE_NOW.keys())
def test_a_naive_load_stamp_is_refused_whatever_the_local_time_zone(
    tmp_path: Path, new_york_clock: None, stamp: Callable[[], Any]
) -> None:
    message = refused(tmp_path, lambda b: b.assign(loaded_at=stamp()))
    assert "every value of 'loaded_at'" in message
    assert "Fix: derive the value from the input" in message


def test_a_stamp_taken_row_by_row_is_refused(tmp_path: Path) -> None:
    def stamped(batch: pd.DataFrame) -> pd.DataFrame:
        return batch.assign(loaded_at=[datetime.now(UTC) for _ in range(len(batch))])

    assert "'allow_runtime_columns': ['loaded_at']" in refused(tmp_path, stamped)


def test_a_correction_whose_source_updated_at_is_minutes_old_is_published(
    tmp_path: Path,
) -> None:
    # A source that corrected these trips over the last quarter hour: a fact of the data.
    now = datetime.now(UTC).replace(tzinfo=None)

    def corrected(batch: pd.DataFrame) -> pd.DataFrame:
        minutes = [2 + (i * 13) % 15 for i in range(len(batch))]
        return batch.assign(updated_at=[now - timedelta(minutes=m) for m in minutes])

    db, _ = publish_with(tmp_path, corrected, n=20)
    with read(db) as conn:
        once = rows(conn)
    publish_with(tmp_path, corrected, n=20)

    with read(db) as conn:
        assert rows(conn) == once
        assert len(once) == 20


UUIDS: dict[str, Callable[[pd.DataFrame], list[str | None]]] = {
    "one row": lambda b: [str(uuid.uuid4())],
    "with one n/a": lambda b: ["n/a"] + [str(uuid.uuid4()) for _ in range(len(b) - 1)],
    "as hex": lambda b: [uuid.uuid4().hex for _ in range(len(b))],
    "version 1": lambda b: [str(uuid.uuid1()) for _ in range(len(b))],
    "braced upper case": lambda b: ["{" + str(uuid.uuid4()).upper() + "}" for _ in range(len(b))],
    "after 100 uuid5s": lambda b: [
        str(uuid.uuid5(uuid.NAMESPACE_URL, str(t))) if i < 100 else str(uuid.uuid4())
        for i, t in enumerate(b["trip_id"])
    ],
}


@pytest.mark.parametrize("values", UUIDS.values(), ids=UUIDS.keys())
def test_random_uuids_are_refused_in_every_spelling(
    tmp_path: Path, values: Callable[[pd.DataFrame], list[str | None]]
) -> None:
    n = 1 if values is UUIDS["one row"] else 200
    message = refused(tmp_path, lambda b: b.assign(row_uuid=values(b)), n=n)
    assert "column 'row_uuid' holds random or time-based uuids" in message


DERIVED: dict[str, Callable[[int], str]] = {
    "uuid5": lambda t: str(uuid.uuid5(uuid.NAMESPACE_URL, f"trip/{t}")),
    "md5 hex": lambda t: hashlib.md5(f"trip/{t}".encode()).hexdigest(),
    "uuid5 hex": lambda t: uuid.uuid5(uuid.NAMESPACE_URL, f"trip/{t}").hex,
}


@pytest.mark.parametrize("derive", DERIVED.values(), ids=DERIVED.keys())
def test_ids_derived_from_the_natural_key_are_published_and_stable(
    tmp_path: Path, derive: Callable[[int], str]
) -> None:
    def derived(batch: pd.DataFrame) -> pd.DataFrame:
        return batch.assign(row_id=[derive(t) for t in batch["trip_id"]])

    db, _ = publish_with(tmp_path, derived)
    with read(db) as conn:
        once = fingerprint(conn)
    publish_with(tmp_path, derived)
    with read(db) as conn:
        assert fingerprint(conn) == once
        assert len(rows(conn)) == 1000


def direct(column: pa.Array) -> None:
    """Run the guard on a one-column batch of a day that ended long ago."""
    settings = ia.resolve_settings(
        asset_key=dg.AssetKey(["ids"]),
        metadata={},
        mode="overwrite",
        default_schema="main",
        partitioned=False,
    )
    check_runtime_values(pa.table({"row_uuid": column}), settings, window(DAY), NOW)


@pytest.mark.parametrize(
    "column",
    [
        pa.array([uuid.uuid4().bytes for _ in range(3)], pa.binary(16)),
        pa.array([str(uuid.uuid4()) for _ in range(3)]).dictionary_encode(),
        pa.array([str(uuid.uuid4()) for _ in range(3)], pa.large_string()),
    ],
    ids=["16 bytes", "dictionary", "large string"],
)
def test_random_uuids_are_refused_in_every_arrow_type(column: pa.Array) -> None:
    with pytest.raises(ia.RuntimeValueError, match="holds random or time-based uuids"):
        direct(column)


def test_uuid5_bytes_pass() -> None:
    direct(
        pa.array([uuid.uuid5(uuid.NAMESPACE_URL, str(i)).bytes for i in range(3)], pa.binary(16))
    )
