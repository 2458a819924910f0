"""A streamed load reads its window through a server-side cursor, a bounded batch at a time."""

from datetime import datetime, timedelta
from functools import partial
from typing import Any

import pyarrow as pa

import idem_assets as ia
from idem_assets.lib.backends.postgres.backend import PostgresBackend, PostgresLocation
from tests.helpers import NOW, run_child, settings, window

MD: dict[str, Any] = {"partition_expr": "pickup_at", "primary_key": ["trip_id"]}
DAY, NEXT = "2026-01-01", "2026-01-02"
#: The rows of the day the memory test loads (about 60 MB as Arrow), and of the day it loads
#: first, so that what any load allocates once is allocated before the measure.
WINDOW_ROWS = 2_000_000
WARM_ROWS = 300_000
#: A child loads a window and reports its peak: ``python -m tests.lib.load_memory``.
LOAD_WORKER = "tests.lib.load_memory"


#: The first trip id of each day's rows: a key lives in one day only.
FIRST_ID = {DAY: 0, NEXT: 10**9}


def day_of(day: str, rows: int) -> pa.Table:
    """``rows`` trips of ``day``, 20 ms apart."""
    start = datetime.fromisoformat(day)
    return pa.table(
        {
            "trip_id": pa.array(range(FIRST_ID[day], FIRST_ID[day] + rows), pa.int64()),
            "pickup_at": pa.array(
                [start + timedelta(milliseconds=20 * i) for i in range(rows)], pa.timestamp("us")
            ),
            "fare": pa.array([i % 97 * 0.5 for i in range(rows)]),
            "vendor": pa.array(["CMT", "VTS"] * (rows // 2) + ["CMT"] * (rows % 2)),
        }
    )


def filled(location: PostgresLocation, rows: dict[str, int]) -> ia.WriteSettings:
    """A trips table holding ``rows[day]`` rows of each day."""
    write = settings("overwrite", MD)
    with PostgresBackend.connect(location) as backend:
        for day, count in rows.items():
            ia.publish(backend, day_of(day, 10), write, window(day), now=NOW)
            # The rest made by the server, as day_of makes them: publishing millions of rows
            # would take most of the test's time.
            backend.cur.execute(
                "INSERT INTO main.trips SELECT $1 + n, $2::timestamp + n * interval '20 ms',"
                " n % 97 * 0.5, CASE n % 2 WHEN 0 THEN 'CMT' ELSE 'VTS' END"
                " FROM generate_series(10, $3 - 1) AS n",
                [FIRST_ID[day], datetime.fromisoformat(day), count],
            )
            backend.conn.commit()
    return write


def streamed(backend: PostgresBackend, write: ia.WriteSettings) -> pa.RecordBatchReader:
    """Day NEXT loaded as a stream."""
    found = backend.load(write, window(NEXT), stream=True)
    assert isinstance(found, pa.RecordBatchReader)
    return found


def test_a_streamed_load_takes_less_memory_than_its_window(
    postgres_location: PostgresLocation,
) -> None:
    """2M rows, about 60 MB as Arrow, loaded streamed in a fresh process after a smaller day.

    A query with bound values comes back from the driver whole: libpq held every row, then one
    Arrow batch of them all, and the peak rose by several times the window. Fetched from a
    cursor a few MB at a time, it rises by a fraction of it.
    """
    write = filled(postgres_location, {DAY: WARM_ROWS, NEXT: WINDOW_ROWS})
    spec = (
        partial(PostgresBackend.connect, postgres_location),
        write,
        window(DAY),
        window(NEXT),
        "64MB",
    )
    loaded = run_child(LOAD_WORKER, spec)
    assert loaded["rows"] == WINDOW_ROWS
    assert loaded["peak_increase"] < loaded["bytes"] / 2, loaded


def test_a_drained_load_leaves_no_cursor_and_a_publish_follows(
    postgres_location: PostgresLocation,
) -> None:
    """The cursor closes with the last batch; one left half read ends with the transaction."""
    write = filled(postgres_location, {NEXT: 5000})
    with PostgresBackend.connect(postgres_location) as backend:
        whole = backend.load(write, window(NEXT))
        assert whole == day_of(NEXT, 5000)
        assert streamed(backend, write).read_all() == whole
        # The statement asking is a cursor too: the unnamed one.
        backend.cur.execute("SELECT count(*) FROM pg_cursors WHERE name <> ''")
        assert backend.cur.fetchall() == [(0,)]
        streamed(backend, write).read_next_batch()
        ia.publish(backend, day_of(NEXT, 10), write, window(NEXT), now=NOW)
    with PostgresBackend.connect(postgres_location) as backend:
        assert backend.load(write, window(NEXT)) == day_of(NEXT, 10)
