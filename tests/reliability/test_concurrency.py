"""Writers racing writers and readers: one complete batch, or a clean error and the old state.

DuckDB lets one process at a time open a database file for writing, and a read-only open is
refused while another process has it open for writing (docs/concurrency.md). Between
processes the outcome is therefore decided by the file lock; inside one process, by DuckDB's
MVCC (snapshot reads, write-write conflicts).
"""

import shutil
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import pytest

import idem_assets as ia

from .support import (
    NOW,
    REPORT,
    count,
    days,
    partition_fingerprints,
    range_batch,
    settings,
    window,
)
from .workers import context, hold_open, open_and_read, race_publish, write_batch

ALL_DAYS = days("2026-01-01", 6)
ROWS = 5_000
LOCKED = "Could not set lock on file"
RACES = count(4, 20)
#: Rows, distinct keys and an exact, order-independent sum of row hashes, per day.
DAY_SUMMARY = (
    "CAST(pickup_at AS DATE) AS day, count(*), count(DISTINCT trip_id),"
    " sum(hash(trip_id, pickup_at, updated_at, passenger_count, fare, zone))"
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("race") / "template.duckdb"
    with duckdb.connect(str(db)) as conn:
        ia.publish(conn, range_batch(ALL_DAYS, ROWS), settings(), window(*ALL_DAYS), now=NOW)
    return db


def fingerprints(db: Path) -> dict[str, Any]:
    """Fingerprint of each day, the row count and the tables of the file."""
    with duckdb.connect(str(db)) as conn:
        return {
            **partition_fingerprints(conn, ALL_DAYS),
            "rows": conn.execute("SELECT count(*) FROM main.trips").fetchall()[0][0],
            "tables": conn.execute("SELECT table_name FROM duckdb_tables()").fetchall(),
        }


def expected(
    template: Path, tmp: Path, mode: str, chunks: Sequence[Sequence[str]], version: int = 1
) -> dict:
    """The warehouse after publishing ``version`` of each chunk in turn, alone."""
    db = tmp / "expected.duckdb"
    shutil.copy(template, db)
    with duckdb.connect(str(db)) as conn:
        for keys in chunks:
            batch = range_batch(keys, ROWS, version)
            ia.publish(conn, batch, settings(mode), window(*keys), now=NOW)
    return fingerprints(db)


def spawn(target: Any, *args: Any) -> tuple[Any, Any]:
    ctx = context()
    reader, writer = ctx.Pipe(duplex=False)
    process = ctx.Process(target=target, args=(*args, writer), daemon=True)
    process.start()
    writer.close()
    return process, reader


def outcome(process: Any, reader: Any, timeout: float = 120) -> tuple[str, str, str]:
    """The child's final report: ``("ok", "", "")`` or ``("error", class, message)``."""
    result = ("locked", "", "")
    while result[0] == "locked":
        assert reader.poll(timeout), "the child reported nothing"
        result = reader.recv()
    process.join(30)
    reader.close()
    return result


@pytest.mark.parametrize("mode", ["overwrite", "merge"])
@pytest.mark.parametrize("retry", [False, True], ids=["plain-connect", "io-manager-retry"])
def test_two_processes_publishing_the_same_partition(
    template: Path, tmp_path: Path, mode: str, retry: bool
) -> None:
    """Both start at the same instant; the winner's batch lands whole, the loser errs or waits."""
    keys = ["2026-01-03"]
    old = fingerprints(template)
    new = {v: expected(template, tmp_path, mode, [keys], v) for v in (1, 2)}
    paths = {}
    for v in (1, 2):
        paths[v] = tmp_path / f"v{v}.arrow"
        write_batch(str(paths[v]), range_batch(keys, ROWS, v))
    db = tmp_path / "w.duckdb"
    seen: Counter[str] = Counter()
    for _ in range(RACES):
        shutil.copy(template, db)
        start_at = time.time() + 0.3
        children = [
            spawn(race_publish, str(db), str(paths[v]), mode, keys, start_at, None, 0.0, retry)
            for v in (1, 2)
        ]
        results = [outcome(*child) for child in children]
        state = fingerprints(db)
        assert state in (new[1], new[2]), f"neither batch is whole: {results}"
        assert state != old
        for status, error, text in results:
            if status == "error":
                assert not retry, f"the retrying writer failed: {error}: {text}"
                assert error == "IOException" and LOCKED in text, text
        seen[" + ".join(sorted(r[0] for r in results))] += 1
    REPORT.append(
        f"concurrency same partition, {mode}, {'retry' if retry else 'plain connect'}:"
        f" {RACES} races: {dict(seen)}"
    )


@pytest.mark.parametrize("retry", [False, True], ids=["plain-connect", "io-manager-retry"])
def test_a_second_writer_while_the_first_is_mid_transaction(
    template: Path, tmp_path: Path, retry: bool
) -> None:
    """The first writer pauses between its delete and insert; the second arrives then."""
    keys = ["2026-01-03"]
    new = {v: expected(template, tmp_path, "overwrite", [keys], v) for v in (1, 2)}
    for v in (1, 2):
        write_batch(str(tmp_path / f"v{v}.arrow"), range_batch(keys, ROWS, v))
    db = tmp_path / "w.duckdb"
    shutil.copy(template, db)

    first = spawn(
        race_publish,
        str(db),
        str(tmp_path / "v1.arrow"),
        "overwrite",
        keys,
        0.0,
        "deleted",
        1.5,
        False,
    )
    assert first[1].poll(60) and first[1].recv()[0] == "locked"
    second = spawn(
        race_publish, str(db), str(tmp_path / "v2.arrow"), "overwrite", keys, 0.0, None, 0.0, retry
    )
    second_result = outcome(*second)
    first_result = outcome(*first)

    assert first_result[0] == "ok"
    if retry:
        # DuckDBResource backs off (0.1 s, 0.2 s, ... ~100 s in all) until the file is free.
        assert second_result[0] == "ok"
        assert fingerprints(db) == new[2]
    else:
        assert second_result[:2] == ("error", "IOException")
        assert LOCKED in second_result[2]
        assert fingerprints(db) == new[1]


def test_readers_in_other_processes_get_a_clean_error_while_a_writer_holds_the_file(
    template: Path, tmp_path: Path
) -> None:
    keys = ["2026-01-02", "2026-01-03"]
    new = expected(template, tmp_path, "overwrite", [keys])
    write_batch(str(tmp_path / "v1.arrow"), range_batch(keys, ROWS, 1))
    db = tmp_path / "w.duckdb"
    shutil.copy(template, db)

    writer = spawn(
        race_publish,
        str(db),
        str(tmp_path / "v1.arrow"),
        "overwrite",
        keys,
        0.0,
        "deleted",
        1.5,
        False,
    )
    assert writer[1].poll(60) and writer[1].recv()[0] == "locked"
    readers = [outcome(*spawn(open_and_read, str(db), read_only)) for read_only in (True, False)]
    assert outcome(*writer)[0] == "ok"

    for status, error, text in readers:
        assert (status, error) == ("error", "IOException"), text
        assert LOCKED in text and "Conflicting lock is held" in text
    # Once the writer has closed the file, a read-only reader sees the whole new batch.
    assert outcome(*spawn(open_and_read, str(db), True)) == ("ok", new["rows"], "")
    assert fingerprints(db) == new


def test_a_reader_holding_the_file_blocks_a_writer_cleanly(template: Path, tmp_path: Path) -> None:
    """A notebook left open read-only: the pipeline's write fails cleanly and changes nothing."""
    keys = ["2026-01-02"]
    write_batch(str(tmp_path / "v1.arrow"), range_batch(keys, ROWS, 1))
    db = tmp_path / "w.duckdb"
    shutil.copy(template, db)
    old = fingerprints(db)

    reader = spawn(hold_open, str(db), True, 1.0)
    assert reader[1].poll(60) and reader[1].recv_bytes() == b"open"
    second_reader = outcome(*spawn(open_and_read, str(db), True))
    result = outcome(
        *spawn(
            race_publish,
            str(db),
            str(tmp_path / "v1.arrow"),
            "overwrite",
            keys,
            0.0,
            None,
            0.0,
            False,
        )
    )
    reader[0].join(30)

    assert second_reader[0] == "ok"  # read-only opens share the file
    assert result[:2] == ("error", "IOException") and LOCKED in result[2]
    assert fingerprints(db) == old


def test_readers_in_the_writer_process_never_see_a_partial_window(
    template: Path, tmp_path: Path
) -> None:
    """Threads reading through their own cursors while a chunk is republished over and over."""
    keys = days("2026-01-02", 3)
    db = tmp_path / "w.duckdb"
    shutil.copy(template, db)
    batches = {v: range_batch(keys, ROWS, v) for v in (1, 2)}
    allowed = []
    for v in (0, 1, 2):
        with duckdb.connect() as scratch:
            batch = range_batch(keys, ROWS, v)
            allowed.append(sorted(_day_counts(scratch, batch)))
    stop = threading.Event()
    observed: Counter[int] = Counter()
    bad: list[Any] = []

    with duckdb.connect(str(db)) as conn:

        def read() -> None:
            cursor = conn.cursor()
            try:
                while not stop.is_set():
                    # One statement: one snapshot of all three days.
                    counts = sorted(
                        cursor.execute(
                            f"SELECT {DAY_SUMMARY} FROM main.trips WHERE pickup_at >= ? AND"
                            " pickup_at < ? GROUP BY day",
                            [
                                window(*keys).start.replace(tzinfo=None),
                                window(*keys).end.replace(tzinfo=None),
                            ],
                        ).fetchall()
                    )
                    if counts in allowed:
                        observed[allowed.index(counts)] += 1
                    else:
                        bad.append(counts)
            finally:
                cursor.close()

        readers = [threading.Thread(target=read) for _ in range(2)]
        for thread in readers:
            thread.start()
        writes = count(20, 100)
        writer = conn.cursor()
        for i in range(writes):
            mode = "merge" if i % 2 else "overwrite"
            ia.publish(writer, batches[1 + i % 2], settings(mode), window(*keys), now=NOW)
        writer.close()
        stop.set()
        for thread in readers:
            thread.join(60)

    assert bad == [], f"a reader saw a partial or doubled window: {bad[:2]}"
    assert sum(observed.values()) > writes
    REPORT.append(
        f"concurrency snapshot reads: {writes} publishes, {sum(observed.values())} reads by 2"
        f" threads, every read one whole version (by version: {dict(sorted(observed.items()))})"
    )


def _day_counts(conn: duckdb.DuckDBPyConnection, batch: Any) -> list[tuple]:
    conn.register("b", batch)
    result = conn.execute(f"SELECT {DAY_SUMMARY} FROM b GROUP BY day").fetchall()
    conn.unregister("b")
    return result


@pytest.mark.parametrize("retry", [False, True], ids=["plain-connect", "io-manager-retry"])
def test_two_chunks_of_one_backfill_racing_in_two_processes(
    template: Path, tmp_path: Path, retry: bool
) -> None:
    """Chunks 2026-01-01..03 and 2026-01-04..06 of one backfill, started at the same instant."""
    chunks = [days("2026-01-01", 3), days("2026-01-04", 3)]
    old = fingerprints(template)
    for i, keys in enumerate(chunks):
        write_batch(str(tmp_path / f"chunk{i}.arrow"), range_batch(keys, ROWS, 1))
    new = expected(template, tmp_path, "overwrite", chunks)
    db = tmp_path / "w.duckdb"
    seen: Counter[str] = Counter()
    for _ in range(RACES):
        shutil.copy(template, db)
        start_at = time.time() + 0.3
        children = [
            spawn(
                race_publish,
                str(db),
                str(tmp_path / f"chunk{i}.arrow"),
                "overwrite",
                keys,
                start_at,
                None,
                0.0,
                retry,
            )
            for i, keys in enumerate(chunks)
        ]
        results = [outcome(*child) for child in children]
        state = fingerprints(db)
        for (status, error, text), keys in zip(results, chunks, strict=True):
            source = new if status == "ok" else old
            assert {k: state[k] for k in keys} == {k: source[k] for k in keys}, (status, text)
            if status == "error":
                assert not retry and error == "IOException" and LOCKED in text, text
        seen[" + ".join(r[0] for r in results)] += 1
    REPORT.append(
        f"concurrency backfill chunks, {'retry' if retry else 'plain connect'}: {RACES} races:"
        f" {dict(seen)}"
    )


@pytest.mark.parametrize(
    ("first", "second", "conflict"),
    [
        (days("2026-01-01", 3), days("2026-01-04", 3), False),
        (days("2026-01-01", 4), days("2026-01-03", 4), True),
    ],
    ids=["disjoint-chunks", "overlapping-chunks"],
)
def test_two_chunks_racing_in_one_process(
    template: Path, tmp_path: Path, first: list[str], second: list[str], conflict: bool
) -> None:
    """Two threads, two cursors of one database, both mid-transaction at once.

    MVCC lets disjoint chunks both commit; overlapping ones conflict, and the loser's error
    leaves the winner's chunk whole.
    """
    chunks = (first, second)
    alone = {i: expected(template, tmp_path, "overwrite", [chunks[i]]) for i in (0, 1)}
    together = expected(template, tmp_path, "overwrite", chunks)
    db = tmp_path / "w.duckdb"
    shutil.copy(template, db)
    barrier = threading.Barrier(2)
    results: dict[int, str] = {}

    def meet(stage: str) -> None:
        if stage == "deleted":
            try:
                barrier.wait(10)  # both transactions have deleted their window
            except threading.BrokenBarrierError:
                pass  # the other one already failed

    with duckdb.connect(str(db)) as conn:

        def run(i: int) -> None:
            cursor = conn.cursor()
            try:
                batch = range_batch(chunks[i], ROWS, 1)
                ia.publish(cursor, batch, settings(), window(*chunks[i]), now=NOW, on_stage=meet)
                results[i] = "ok"
            except duckdb.Error as exc:
                barrier.abort()
                results[i] = f"{type(exc).__name__}: {exc}"
            finally:
                cursor.close()

        threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)

    state = fingerprints(db)
    if conflict:
        winners = [i for i, r in results.items() if r == "ok"]
        assert len(winners) == 1, results
        loser = results[1 - winners[0]]
        assert "TransactionException" in loser and "Conflict" in loser, loser
        assert state == alone[winners[0]]
    else:
        assert results == {0: "ok", 1: "ok"}, results
        assert state == together
