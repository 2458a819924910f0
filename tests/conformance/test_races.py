"""Writers racing in real processes, held at a barrier right before their commits, on every engine.

Both writers pass every guard before either commits, so a check that reads only committed rows
sees nothing of the other. What each engine must still hold: the key contract of a merge (a key
lives in one partition) and a table every later run can write.
"""

import multiprocessing.connection
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import idem_assets as ia
from tests.conformance.conftest import Store
from tests.conformance.race_workers import publish_at_barrier
from tests.helpers import NOW, settings, window
from tests.reliability.support import REPORT, count
from tests.reliability.workers import context, write_batch

pytestmark = pytest.mark.slow

TRIPS: dict[str, Any] = {"partition_expr": "pickup_at", "primary_key": ["trip_id"]}
FIRST, SECOND, THIRD = "2026-01-01", "2026-01-02", "2026-01-03"
SHARED = 7
#: Rounds of each race. Held at the barrier, a writer that commits without seeing the other
#: breaks the first round already; more rounds try the other writer as the winner.
RACES = count(2, 10)
#: Spark's racing writers start a JVM each, about 140 s of a loaded make test a round: one.
SPARK_RACES = count(1, 10)
#: A deadline for a hung writer, not a slow one: a Spark writer starts a JVM of its own.
WAIT_S = 300.0
#: DuckDB lets one process at a time open a file for writing: the other's open fails at once.
LOCKED = "Could not set lock on file"


def trips(day: str, ids: Sequence[int]) -> pa.Table:
    """Trips ``ids`` picked up an hour apart on ``day``."""
    start = datetime.fromisoformat(day)
    return pa.table(
        {
            "trip_id": pa.array(ids, pa.int64()),
            "pickup_at": pa.array(
                [start + timedelta(hours=i) for i in range(len(ids))], pa.timestamp("us")
            ),
            "fare": pa.array([float(i) for i in ids]),
        }
    )


def rows_of(batch: pa.Table) -> list[tuple]:
    return sorted(zip(*batch.to_pydict().values(), strict=True))


def publish(store: Store, batch: pa.Table, day: str, table: str) -> None:
    with store.open() as backend:
        ia.publish(backend, batch, settings("merge", TRIPS, table=table), window(day), now=NOW)


def race(
    store: Store,
    directory: Path,
    batches: dict[str, pa.Table],
    table: str,
    metadata: dict[str, Any] = TRIPS,
    streamed: bool = False,
) -> dict[str, tuple[str, Any, str]]:
    """Publish each day's batch in its own process, all held before commit; their outcomes."""
    ctx = context()
    barrier = ctx.Barrier(len(batches))
    readers: dict[Any, tuple[str, Any]] = {}
    for day, batch in batches.items():
        path = directory / f"{table}-{day}.arrow"
        write_batch(str(path), batch)
        reader, writer = ctx.Pipe(duplex=False)
        process = ctx.Process(
            target=publish_at_barrier,
            args=(
                store.open,
                str(path),
                "merge",
                metadata,
                table,
                [day],
                barrier,
                writer,
                streamed,
            ),
            daemon=True,
        )
        process.start()
        writer.close()
        readers[reader] = (day, process)
    outcomes: dict[str, tuple[str, Any, str]] = {}
    while len(outcomes) < len(batches):
        ready = multiprocessing.connection.wait(list(readers), WAIT_S)
        assert ready, f"the writers stopped reporting: {outcomes}"
        for reader in ready:
            day, _ = readers[reader]
            message = reader.recv() if reader.poll() else ("error", "EOFError", "")
            if message[0] == "held":
                continue
            outcomes[day] = message
            del readers[reader]
            if message[0] == "error":
                # A writer that failed never reaches the barrier: let the other one go on.
                barrier.abort()
    return outcomes


@pytest.mark.parametrize("how", ["table", "streamed", "upsert"])
def test_merges_of_two_days_sharing_a_new_key_leave_it_in_exactly_one_day(
    store: Store, tmp_path: Path, how: str
) -> None:
    """Day 2 with trips [100, 7] and day 3 with [200, 7] at once: one stores 7, one is refused.

    Streamed, each batch is staged first, and an engine may write it otherwise than a table;
    an upsert (delete_missing False) may read only the window's rows that hold its keys.
    """
    metadata = {**TRIPS, "delete_missing": False} if how == "upsert" else TRIPS
    batches = {SECOND: trips(SECOND, [100, SHARED]), THIRD: trips(THIRD, [200, SHARED])}
    refusals = {"KeyOutsideWindowError"} | ({"IOException"} if store.name == "duckdb" else set())
    seen: dict[str, int] = {}
    races = SPARK_RACES if store.name == "spark" else RACES
    for attempt in range(races):
        table = f"trips_{attempt}"
        publish(store, trips(FIRST, [1, 2]), FIRST, table)
        outcomes = race(store, tmp_path, batches, table, metadata, how == "streamed")
        committed = [day for day, (kind, _, _) in outcomes.items() if kind == "committed"]
        refused = {day: outcome for day, outcome in outcomes.items() if day not in committed}
        assert len(committed) == 1, f"exactly one writer must commit: {outcomes}"
        ((loser, (_, error, message)),) = refused.items()
        assert error in refusals, f"{error}: {message}"
        if error == "IOException":
            assert LOCKED in message, message
        else:
            assert "Nothing was changed. Fix:" in message
        (winner,) = committed
        stored = store.rows(table)
        assert [r[0] for r in stored].count(SHARED) == 1
        assert stored == rows_of(pa.concat_tables([trips(FIRST, [1, 2]), batches[winner]]))
        # Not stuck: the winner's day reruns, the loser's day stores its other trips.
        publish(store, batches[winner], winner, table)
        loser_ids = [100] if loser == SECOND else [200]
        publish(store, trips(loser, loser_ids), loser, table)
        with pytest.raises(ia.KeyOutsideWindowError):
            publish(store, batches[loser], loser, table)
        expected = [trips(FIRST, [1, 2]), batches[winner], trips(loser, loser_ids)]
        assert store.rows(table) == rows_of(pa.concat_tables(expected))
        seen[error] = seen.get(error, 0) + 1
    REPORT.append(
        f"races, merges ({how}) sharing a new key, {store.name}: {races} races, losers {seen}"
    )
