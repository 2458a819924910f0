"""Postgres writers racing in real processes: a day is never doubled, other days run in parallel.

Each writer is an OS process publishing through the Postgres backend. A writer can be held
inside its transaction at a publish stage until the test releases it, so every interleaving
here is forced and observed (the other writer's backend waiting on an advisory lock in
pg_stat_activity), never left to timing.
"""

import time
import uuid
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import idem_assets as ia
from idem_assets.lib.backends.postgres.backend import PostgresBackend, PostgresLocation
from tests.helpers import NOW, TRIPS_METADATA, settings, window
from tests.postgres.workers import publish_held
from tests.reliability.support import day_batch, days, range_batch
from tests.reliability.workers import context, write_batch

pytestmark = pytest.mark.slow

DAYS = days("2026-01-01", 4)
ROWS = 2_000
WAIT_S = 60.0


class Writer:
    """One child process publishing a batch, and what it reported so far."""

    def __init__(
        self,
        location: PostgresLocation,
        directory: Path,
        keys: Sequence[str],
        version: int,
        mode: str = "overwrite",
        hold_at: str | None = None,
        batch: pa.Table | None = None,
        metadata: dict[str, Any] = TRIPS_METADATA,
    ) -> None:
        ctx = context()
        self.batch = range_batch(keys, ROWS, version) if batch is None else batch
        path = directory / f"batch-{'-'.join(keys)}-v{version}-{uuid.uuid4().hex[:8]}.arrow"
        write_batch(str(path), self.batch)
        self.release = ctx.Event()
        self.reader, writer = ctx.Pipe(duplex=False)
        self.process = ctx.Process(
            target=publish_held,
            args=(location, str(path), mode, list(keys), hold_at, self.release, writer, metadata),
            daemon=True,
        )
        self.process.start()
        writer.close()
        self.events: dict[str, Any] = {}
        self.times: dict[str, float] = {}

    def wait_for(self, event: str) -> Any:
        """Read reports until ``event`` (a stage name, ``pid`` or ``committed``) arrives."""
        while event not in self.events:
            assert self.reader.poll(WAIT_S), f"the writer never reported {event!r}"
            kind, value, at = self.reader.recv()
            assert kind != "error", value
            name = value if kind == "stage" else kind
            self.events[name], self.times[name] = value, at
        return self.events[event]

    def finish(self) -> None:
        """Release the writer, wait for its commit and for the process to exit."""
        self.release.set()
        self.wait_for("committed")
        self.process.join(WAIT_S)
        assert self.process.exitcode == 0

    def refusal(self) -> str:
        """Release the writer and return the traceback it failed with (it must fail)."""
        self.release.set()
        while True:
            assert self.reader.poll(WAIT_S), "the writer never finished"
            kind, value, _ = self.reader.recv()
            assert kind != "committed", "the writer committed; it had to be refused"
            if kind == "error":
                self.process.join(WAIT_S)
                return value


def query(location: PostgresLocation, text: str, params: Sequence[Any] = ()) -> list[tuple]:
    with PostgresBackend.connect(location) as backend:
        backend.cur.execute(text, list(params) or None)
        return backend.cur.fetchall()


def wait_until_blocked(
    location: PostgresLocation, pid: int, locks: Sequence[str] = ("advisory",)
) -> None:
    """Until the backend ``pid`` waits on a lock of one of the kinds ``locks`` names."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        rows = query(
            location,
            "SELECT wait_event_type, wait_event FROM pg_stat_activity WHERE pid = $1",
            [pid],
        )
        if rows and rows[0][0] == "Lock" and rows[0][1] in locks:
            return
        time.sleep(0.02)
    raise AssertionError(f"backend {pid} never waited on a lock of {locks}")


def publish(location: PostgresLocation, batch: pa.Table, keys: Sequence[str], table: str) -> None:
    with PostgresBackend.connect(location) as backend:
        ia.publish(
            backend,
            batch,
            settings("overwrite", TRIPS_METADATA, table=table),
            window(*keys),
            now=NOW,
        )


def per_day(location: PostgresLocation, table: str = "trips") -> dict[str, str | None]:
    with PostgresBackend.connect(location) as backend:
        return {
            d: ia.table_fingerprint(backend, "main", table, "pickup_at", window(d)) for d in DAYS
        }


def expected_per_day(location: PostgresLocation, batches: Sequence[pa.Table]) -> dict:
    """Each day's fingerprint after publishing ``batches`` one after the other, alone."""
    for batch in batches:
        keys = sorted({t.date().isoformat() for t in batch.column("pickup_at").to_pylist()})
        publish(location, batch, keys, "expected")
    return per_day(location, "expected")


@pytest.mark.parametrize("mode", ["overwrite", "merge"])
@pytest.mark.parametrize("before", ["no-table", "first-write", "rerun"])
def test_two_writers_of_one_day_leave_exactly_the_last_batch(
    postgres_location: PostgresLocation, tmp_path: Path, mode: str, before: str
) -> None:
    """The second writer waits for the first's commit, then replaces its rows: never doubled."""
    day = DAYS[0]
    if before == "rerun":
        publish(postgres_location, day_batch(day, ROWS), [day], "trips")
    elif before == "first-write":
        # The table exists, the day does not: the DELETE has no row to wait on (the 10-row case).
        publish(postgres_location, day_batch(DAYS[1], ROWS), [DAYS[1]], "trips")
    first = Writer(postgres_location, tmp_path, [day], 1, mode, hold_at="deleted")
    first.wait_for("deleted")
    second = Writer(postgres_location, tmp_path, [day], 2, mode)
    wait_until_blocked(postgres_location, second.wait_for("pid"))
    assert "guards_passed" not in second.events
    first.finish()
    second.finish()
    assert second.times["guards_passed"] > first.times["before_commit"]
    rows = query(
        postgres_location,
        "SELECT count(*) FROM main.trips WHERE pickup_at < $1",
        [date(2026, 1, 2)],
    )
    assert rows == [(second.batch.num_rows,)]
    assert (
        per_day(postgres_location)[day] == expected_per_day(postgres_location, [second.batch])[day]
    )


@pytest.mark.parametrize(
    ("mode", "hold_at"), [("overwrite", "deleted"), ("merge", "before_commit")]
)
def test_writers_of_different_days_overlap_and_both_commit(
    postgres_location: PostgresLocation, tmp_path: Path, mode: str, hold_at: str
) -> None:
    """While one day's writer holds its transaction open, another day's writer commits.

    A merge checks its keys once more at its commit (they must not have reached another day
    meanwhile): held after all its writes, it still lets a merge of disjoint keys commit.
    """
    publish(postgres_location, range_batch(DAYS, ROWS), DAYS, "trips")
    first = Writer(postgres_location, tmp_path, [DAYS[0]], 1, mode, hold_at=hold_at)
    first.wait_for(hold_at)
    second = Writer(postgres_location, tmp_path, [DAYS[1]], 2, mode)
    second.wait_for("committed")
    assert "committed" not in first.events
    first.finish()
    # The second writer's whole transaction lies inside the first one's.
    assert first.times[hold_at] < second.times["guards_passed"]
    assert second.times["committed"] < first.times["committed"]
    expected = expected_per_day(
        postgres_location, [range_batch(DAYS, ROWS), first.batch, second.batch]
    )
    assert per_day(postgres_location) == expected


def test_first_writers_of_a_new_table_both_commit(
    postgres_location: PostgresLocation, tmp_path: Path
) -> None:
    """Two writers creating the same table at once: one creates it, the other waits, both land."""
    writers = [Writer(postgres_location, tmp_path, [d], 0) for d in DAYS[:2]]
    for writer in writers:
        writer.finish()
    owners = query(postgres_location, 'SELECT * FROM main."idem-table-owners"')
    assert owners == [("main", "trips", "trips")]
    expected = expected_per_day(postgres_location, [w.batch for w in writers])
    assert per_day(postgres_location) == expected


def test_overlapping_ranges_queue_in_lock_order_without_deadlock(
    postgres_location: PostgresLocation, tmp_path: Path
) -> None:
    """Ranges sharing days take their locks in one order: the later waits, then both commit."""
    publish(postgres_location, range_batch(DAYS, ROWS), DAYS, "trips")
    first = Writer(postgres_location, tmp_path, DAYS[:3], 1, hold_at="deleted")
    first.wait_for("deleted")
    second = Writer(postgres_location, tmp_path, DAYS[1:], 2)
    wait_until_blocked(postgres_location, second.wait_for("pid"))
    first.finish()
    second.finish()
    expected = expected_per_day(
        postgres_location, [range_batch(DAYS, ROWS), first.batch, second.batch]
    )
    assert per_day(postgres_location) == expected


def test_a_reader_during_a_long_write_sees_the_old_rows(
    postgres_location: PostgresLocation, tmp_path: Path
) -> None:
    """MVCC: a write holding its transaction open never blocks a reader, who sees the old day."""
    day = DAYS[0]
    old = day_batch(day, ROWS)
    publish(postgres_location, old, [day], "trips")
    writer = Writer(postgres_location, tmp_path, [day], 1, hold_at="inserted")
    writer.wait_for("inserted")
    with PostgresBackend.connect(postgres_location) as backend:
        during = backend.load(settings("overwrite", TRIPS_METADATA), window(day), False, True)
    assert "committed" not in writer.events
    writer.finish()
    with PostgresBackend.connect(postgres_location) as backend:
        after = backend.load(settings("overwrite", TRIPS_METADATA), window(day), False, True)
    assert isinstance(during, pa.Table) and isinstance(after, pa.Table)
    assert during.sort_by("trip_id").equals(old.sort_by("trip_id"))
    assert after.sort_by("trip_id").equals(writer.batch.sort_by("trip_id"))


def with_tip(batch: pa.Table) -> pa.Table:
    """``batch`` with a column ``tip`` the other writer's batch lacks."""
    return batch.append_column("tip", pa.array([1.5] * batch.num_rows))


@pytest.mark.parametrize("evolution", ["strict", "add_columns"])
@pytest.mark.parametrize("first_has_tip", [True, False], ids=["first-has-tip", "second-has-tip"])
def test_first_writers_of_a_new_table_with_other_columns_refit_the_later_batch(
    postgres_location: PostgresLocation, tmp_path: Path, evolution: str, first_has_tip: bool
) -> None:
    """Both stage against no table; the later one is fitted to the table the first created.

    A batch lacking a column of that table is refused as such, never stored with NULLs; a batch
    with a column the table lacks is refused, or adds it when the asset opted in.
    """
    metadata = {**TRIPS_METADATA, "schema_evolution": evolution}
    batches = [day_batch(DAYS[0], ROWS), day_batch(DAYS[1], ROWS)]
    batches[0 if first_has_tip else 1] = with_tip(batches[0 if first_has_tip else 1])
    first = Writer(
        postgres_location,
        tmp_path,
        [DAYS[0]],
        0,
        "overwrite",
        "before_commit",
        batches[0],
        metadata,
    )
    first.wait_for("before_commit")
    second = Writer(postgres_location, tmp_path, [DAYS[1]], 0, batch=batches[1], metadata=metadata)
    wait_until_blocked(postgres_location, second.wait_for("pid"))
    first.finish()
    columns = "trip_id, pickup_at, updated_at, passenger_count, fare, zone, tip"
    stored = f"SELECT {columns} FROM main.trips ORDER BY trip_id"
    if first_has_tip:
        refusal = second.refusal()
        assert "SchemaMismatchError" in refusal and "missing columns ['tip']" in refusal
        assert "Nothing was changed." in refusal
        assert query(postgres_location, stored) == sorted(rows_of(batches[0]))
    elif evolution == "strict":
        refusal = second.refusal()
        assert "SchemaMismatchError" in refusal and "extra columns ['tip']" in refusal
        assert query(postgres_location, "SELECT count(*) FROM main.trips") == [(ROWS,)]
    else:
        second.finish()
        untipped = batches[0].append_column("tip", pa.nulls(ROWS, pa.float64()))
        assert query(postgres_location, stored) == sorted(rows_of(untipped) + rows_of(batches[1]))


def rows_of(batch: pa.Table) -> list[tuple]:
    return list(zip(*batch.to_pydict().values(), strict=True))


@pytest.mark.parametrize("hold_at", ["guards_passed", "before_commit"])
def test_two_writers_adding_one_column_both_commit(
    postgres_location: PostgresLocation, tmp_path: Path, hold_at: str
) -> None:
    """Two days' writers both add ``tip``: the later re-reads the table, finds it, and commits.

    Held before its ALTER TABLE, the first makes the second wait (the two ALTERs would wait for
    each other's reads); held after it, the second finds the column already there.
    """
    metadata = {**TRIPS_METADATA, "schema_evolution": "add_columns"}
    publish(postgres_location, day_batch(DAYS[0], ROWS), [DAYS[0]], "trips")
    batches = [with_tip(day_batch(d, ROWS)) for d in DAYS[1:3]]
    first = Writer(
        postgres_location, tmp_path, [DAYS[1]], 0, "overwrite", hold_at, batches[0], metadata
    )
    first.wait_for(hold_at)
    second = Writer(postgres_location, tmp_path, [DAYS[2]], 0, batch=batches[1], metadata=metadata)
    # On the table's schema lock (advisory); a writer without it waits on the ALTER (relation).
    wait_until_blocked(postgres_location, second.wait_for("pid"), ("advisory", "relation"))
    first.finish()
    second.finish()
    columns = "trip_id, pickup_at, updated_at, passenger_count, fare, zone, tip"
    stored = query(
        postgres_location, f"SELECT {columns} FROM main.trips WHERE tip IS NOT NULL ORDER BY 1"
    )
    assert stored == sorted(rows_of(batches[0]) + rows_of(batches[1]))
