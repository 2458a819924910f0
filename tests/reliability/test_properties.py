"""Property-based rerun tests: any history of publishes ends where one clean run would.

Inputs are versions of each day's batch (0 is the original, 1-3 are corrections, ``EMPTY`` is
a day whose input became empty); a history is a random sequence of single-day publishes,
reruns of the same version, corrections and multi-day chunks. Hypothesis runs derandomized, so
every run tries the same examples; ``IDEM_FULL=1`` tries more.
"""

from collections.abc import Sequence
from functools import cache
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

import idem_assets as ia

from .support import (
    NOW,
    PARTITION,
    count,
    day_batch,
    days,
    partition_fingerprints,
    rows,
    settings,
    window,
)

DAYS = days("2026-01-01", 5)
ROWS_PER_DAY = 8
EMPTY = 4
VERSIONS = st.integers(0, EMPTY)
MODES = {
    "overwrite": {"partition_expr": PARTITION, "allow_empty": True},
    "merge": {
        "partition_expr": PARTITION,
        "primary_key": ["trip_id"],
        "dedupe_order_by": ["updated_at"],
        "allow_empty": True,
    },
}

PROPERTY_SETTINGS = hypothesis_settings(
    max_examples=count(30, 200),
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@cache
def day_input(day: str, version: int, mode: str) -> pa.Table:
    """The batch a source delivers for ``day``; merge inputs carry re-sent (older) copies."""
    if version == EMPTY:
        return day_batch(day, ROWS_PER_DAY).slice(0, 0)
    return day_batch(day, ROWS_PER_DAY, version, duplicates=2 if mode == "merge" else 0)


def publish(
    conn: duckdb.DuckDBPyConnection, mode: str, versions: dict[str, int] | Sequence[Any]
) -> None:
    """Publish one chunk: the given version of each of its (consecutive) days, in one write."""
    chosen = dict(versions)
    keys = sorted(chosen)
    batch = pa.concat_tables([day_input(k, v, mode) for k, v in chosen.items()])
    ia.publish(conn, batch, settings(mode, MODES[mode]), window(*keys), now=NOW)


def model(latest: dict[str, int], mode: str) -> list[tuple]:
    """The table as plain Python: each day's latest input, re-sent copies dropped for a merge."""
    expected = []
    for day, version in latest.items():
        if version != EMPTY:
            expected += day_batch(day, ROWS_PER_DAY, version).to_pylist()
    return sorted(tuple(r.values()) for r in expected)


@st.composite
def chunk(draw: Any) -> dict[str, int]:
    """One publish: a run of 1-3 consecutive days, each with a version."""
    first = draw(st.integers(0, len(DAYS) - 1))
    length = draw(st.integers(1, min(3, len(DAYS) - first)))
    return {day: draw(VERSIONS) for day in DAYS[first : first + length]}


@pytest.mark.parametrize("mode", list(MODES))
@PROPERTY_SETTINGS
@given(history=st.lists(chunk(), min_size=1, max_size=8))
def test_any_history_ends_where_one_clean_run_over_the_latest_inputs_ends(
    mode: str, history: list[dict[str, int]]
) -> None:
    latest: dict[str, int] = {}
    with duckdb.connect() as conn:
        for versions in history:
            publish(conn, mode, versions)
            latest.update(versions)
        got = rows(conn)
        got_days = partition_fingerprints(conn, DAYS)

    with duckdb.connect() as clean:
        for day in sorted(latest):
            publish(clean, mode, {day: latest[day]})
        assert got == rows(clean)
        assert got_days == partition_fingerprints(clean, DAYS)
    assert got == model(latest, mode)


@pytest.mark.parametrize("mode", list(MODES))
@PROPERTY_SETTINGS
@given(before=st.lists(chunk(), max_size=4), backfill=chunk())
def test_a_range_in_one_chunk_equals_the_same_range_day_by_day(
    mode: str, before: list[dict[str, int]], backfill: dict[str, int]
) -> None:
    with duckdb.connect() as chunked, duckdb.connect() as daily:
        for versions in before:
            publish(chunked, mode, versions)
            publish(daily, mode, versions)
        publish(chunked, mode, backfill)
        for day, version in backfill.items():
            publish(daily, mode, {day: version})
        assert rows(chunked) == rows(daily)
        assert partition_fingerprints(chunked, DAYS) == partition_fingerprints(daily, DAYS)


@pytest.mark.parametrize("mode", list(MODES))
@PROPERTY_SETTINGS
@given(
    order=st.lists(
        st.tuples(st.sampled_from(DAYS), VERSIONS), min_size=1, max_size=5, unique_by=lambda t: t[0]
    ).flatmap(lambda xs: st.tuples(st.just(xs), st.permutations(xs)))
)
def test_the_order_of_independent_partitions_does_not_matter(
    mode: str, order: tuple[list[tuple[str, int]], list[tuple[str, int]]]
) -> None:
    first, second = order
    with duckdb.connect() as a, duckdb.connect() as b:
        for day, version in first:
            publish(a, mode, {day: version})
        for day, version in second:
            publish(b, mode, {day: version})
        assert rows(a) == rows(b)
        assert partition_fingerprints(a, DAYS) == partition_fingerprints(b, DAYS)
