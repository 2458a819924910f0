"""Two DELETE+INSERT writers of one partition under READ COMMITTED, on a real PostgreSQL 15+.

The hazard the Postgres warehouse backend must close (issue 15): a writer's DELETE reads with
the snapshot its statement started with, so it never sees the rows a concurrent writer inserts
and commits meanwhile, and the partition ends up with both writers' rows. Taking a
transaction-scoped advisory lock on (table, window) before the DELETE serialises the writers of
one window and leaves writers of other windows alone:

    SELECT pg_advisory_xact_lock(hashtext(%(table)s), hashtext(%(window)s));

A hash collision only makes two windows wait for each other; it never lets two writers of the
same window overlap.
"""

import threading
import uuid
from collections.abc import Iterator
from datetime import date, timedelta
from typing import Any

import psycopg2
import pytest
from postgres_server import PostgresServer, connect

pytestmark = pytest.mark.slow

TABLE = "public.trips"
DAY = date(2026, 1, 1)
ROWS = 5
LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtext(%(table)s), hashtext(%(window)s))"
DELETE_SQL = "DELETE FROM public.trips WHERE pickup_at >= %(start)s AND pickup_at < %(end)s"
INSERT_SQL = "INSERT INTO public.trips (pickup_at, fare) VALUES (%(start)s, %(fare)s)"
WAIT_S = 30.0


@pytest.fixture
def database(postgres_server: PostgresServer) -> Iterator[dict[str, Any]]:
    name = f"dw_{uuid.uuid4().hex[:12]}"
    postgres_server.create_database(name)
    kwargs = postgres_server.connect_kwargs(name)
    with connect(**kwargs) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE public.trips (pickup_at timestamp NOT NULL, fare numeric)")
    yield kwargs


def params(fare: int) -> dict[str, Any]:
    start = DAY
    return {
        "table": TABLE,
        "window": f"[{start.isoformat()}, {(start + timedelta(days=1)).isoformat()})",
        "start": start,
        "end": start + timedelta(days=1),
        "fare": fare,
    }


def seed(kwargs: dict[str, Any], rows: int) -> None:
    with connect(**kwargs) as conn, conn.cursor() as cur:
        for _ in range(rows):
            cur.execute(INSERT_SQL, params(0))


def wait_for_b(kwargs: dict[str, Any], pid: int, b_deleted: threading.Event) -> str | None:
    """Wait until B's backend waits on a lock (return what on) or B has deleted (None)."""
    conn = psycopg2.connect(**kwargs)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for _ in range(int(WAIT_S / 0.02)):
                cur.execute(
                    "SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = %s",
                    (pid,),
                )
                row = cur.fetchone()
                if row is not None and row[0] == "Lock":
                    return row[1]
                if b_deleted.wait(0.02):
                    return None
    finally:
        conn.close()
    raise AssertionError(f"backend {pid} neither waited on a lock nor deleted")


def overwrite_concurrently(kwargs: dict[str, Any], *, lock: bool) -> tuple[int, str | None]:
    """Run writer A and B through one interleaving; return the partition's rows and B's wait.

    A deletes the partition; B takes its lock or runs its DELETE, which blocks on A or (with no
    row to wait for) goes through; A inserts its rows and commits; B finishes. Each writer
    inserts ROWS rows in one transaction.
    """
    a, b = psycopg2.connect(**kwargs), psycopg2.connect(**kwargs)
    a_deleted, b_deleted = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def writer_b() -> None:
        try:
            assert a_deleted.wait(WAIT_S)
            with b.cursor() as cur:
                if lock:
                    cur.execute(LOCK_SQL, params(2))
                cur.execute(DELETE_SQL, params(2))
                b_deleted.set()
                for _ in range(ROWS):
                    cur.execute(INSERT_SQL, params(2))
            b.commit()
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=writer_b)
    thread.start()
    try:
        with a.cursor() as cur:
            if lock:
                cur.execute(LOCK_SQL, params(1))
            cur.execute(DELETE_SQL, params(1))
            a_deleted.set()
            waited_on = wait_for_b(kwargs, b.get_backend_pid(), b_deleted)
            for _ in range(ROWS):
                cur.execute(INSERT_SQL, params(1))
        a.commit()
    finally:
        a_deleted.set()
        thread.join(WAIT_S)
        a.close()
        b.close()
    assert not errors, errors
    with connect(**kwargs) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM public.trips")
        row = cur.fetchone()
    assert row is not None
    (count,) = row
    return count, waited_on


@pytest.mark.parametrize("existing_rows", [0, ROWS], ids=["first-write", "rerun"])
def test_two_read_committed_writers_double_the_partition(
    database: dict[str, Any], existing_rows: int
) -> None:
    seed(database, existing_rows)
    count, waited_on = overwrite_concurrently(database, lock=False)
    assert count == 2 * ROWS == 10
    # On a rerun B waits for A's deleted rows, then skips them as already gone; on a first write
    # there is nothing to delete and B does not wait at all.
    assert waited_on == ("transactionid" if existing_rows else None)


@pytest.mark.parametrize("existing_rows", [0, ROWS], ids=["first-write", "rerun"])
def test_a_per_window_advisory_lock_leaves_one_writers_rows(
    database: dict[str, Any], existing_rows: int
) -> None:
    seed(database, existing_rows)
    count, waited_on = overwrite_concurrently(database, lock=True)
    assert count == ROWS == 5
    assert waited_on == "advisory"
