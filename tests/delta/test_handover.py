"""A streamed batch is handed to delta-rs's writer a bounded amount at a time."""

import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from idem_assets.lib.backends.delta import handover
from idem_assets.lib.backends.delta.handover import bounded

ROWS = 100_000
BATCHES = 60
#: Two int64 columns, no nulls: each batch is exactly this many bytes in the pool.
BATCH_BYTES = ROWS * 16
BOUND = 8 * BATCH_BYTES // 2


def _reader(batches: int = BATCHES) -> pa.RecordBatchReader:
    """``batches`` batches built beforehand, so the reader is faster than any writer."""
    schema = pa.schema([("id", pa.int64()), ("day", pa.int64())])
    parts = [
        pa.record_batch(
            [pa.array(np.arange(i * ROWS, (i + 1) * ROWS)), pa.array(np.full(ROWS, i % 3))],
            schema=schema,
        )
        for i in range(batches)
    ]
    return pa.RecordBatchReader.from_batches(schema, iter(parts))


def _finished(work: Callable[[], object], seconds: float) -> bool:
    """Whether ``work`` returned within ``seconds`` (run on a thread, left behind if not)."""
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive()


def _slow_write(
    reader: pa.RecordBatchReader,
    pause: tuple[int, threading.Event] | None = None,
    on_batch: Callable[[], None] = lambda: None,
) -> tuple[list[int], list[int]]:
    """Take ``reader``'s batches as fast as it gives them, freeing one every 5 ms.

    What the system pool held past its size at the start as each batch was taken, and the ids
    freed, in order; ``pause``: after that many batches the writer frees none until the event.
    """
    pool = pa.system_memory_pool()
    before = pool.bytes_allocated()
    taken: deque[pa.RecordBatch] = deque()
    held: list[int] = []
    ids: list[int] = []
    done = threading.Event()

    def write() -> None:
        freed = 0
        while not (done.is_set() and not taken):
            if taken:
                batch = taken.popleft()
                ids.extend(batch.column(0).to_pylist())
                del batch
                freed += 1
                if pause is not None and freed == pause[0]:
                    pause[1].wait(30)
            time.sleep(0.005)

    writer = threading.Thread(target=write)
    writer.start()
    for batch in reader:
        taken.append(batch)
        held.append(pool.bytes_allocated() - before)
        del batch
        on_batch()
    done.set()
    writer.join()
    return held, ids


@pytest.fixture
def no_stall(monkeypatch: pytest.MonkeyPatch) -> None:
    """No stall lets a batch past the bound: a busy machine cannot make the test pass or fail."""
    monkeypatch.setattr(handover, "STALL_SECONDS", 3600.0)


@pytest.mark.usefixtures("no_stall")
def test_a_writer_slower_than_the_reader_holds_at_most_the_bound() -> None:
    """A consumer taking every batch at once, freeing one every 5 ms, holds the bound and one batch.

    Handed over unbounded, it held nearly all 60 batches (96 MB) before freeing the first few.
    """
    before = pa.system_memory_pool().bytes_allocated()
    held, ids = _slow_write(bounded(_reader(), BOUND))
    assert BOUND <= max(held) <= BOUND + BATCH_BYTES, max(held)
    assert ids == list(range(BATCHES * ROWS))
    assert pa.system_memory_pool().bytes_allocated() == before


@pytest.fixture
def stalls(monkeypatch: pytest.MonkeyPatch) -> threading.Semaphore:
    """Stalls of 0.3 s, each released on the semaphore (it starts at 0) as the wait gives up."""
    counted = threading.Semaphore(0)
    room = handover._room

    def watched(pool: pa.MemoryPool, limit: int) -> bool:
        found = room(pool, limit)
        if not found:
            counted.release()
        return found

    monkeypatch.setattr(handover, "STALL_SECONDS", 0.3)
    monkeypatch.setattr(handover, "_room", watched)
    return counted


def _count(stalls: threading.Semaphore) -> int:
    """How many stalls there were."""
    found = 0
    while stalls.acquire(blocking=False):
        found += 1
    return found


def test_a_writer_that_pauses_is_bounded_again_once_it_frees(stalls: threading.Semaphore) -> None:
    """A writer that stops freeing for longer than a stall takes one bound more, then the bound.

    Waiting stopped for good at the first stall: the rest of the stream went at once.
    """
    stalled = threading.Event()

    def resume_at_the_stall() -> None:
        # The writer waits on an event: the first stall sets it, and puts its count back.
        if stalls.acquire(timeout=30):
            stalls.release()
            stalled.set()

    threading.Thread(target=resume_at_the_stall, daemon=True).start()
    held, ids = _slow_write(bounded(_reader(), BOUND), pause=(5, stalled))
    assert _count(stalls) == 1
    assert BOUND + BATCH_BYTES < max(held) <= 2 * BOUND + 2 * BATCH_BYTES, max(held)
    assert max(held[-20:]) <= BOUND + BATCH_BYTES, held[-20:]
    assert ids == list(range(BATCHES * ROWS))


def test_a_writer_that_frees_only_between_waits_is_stalled_twice_in_all(
    stalls: threading.Semaphore,
) -> None:
    """A writer on the one thread the wait holds (freeing only as it takes a batch): two stalls.

    Bounded again whenever it had freed anything, it was stalled again and again: a second each.
    """
    taken: deque[pa.RecordBatch] = deque()
    ids: list[int] = []
    for batch in bounded(_reader(), BOUND):
        taken.append(batch)
        del batch
        if len(taken) > 12:
            ids.extend(taken.popleft().column(0).to_pylist())
    ids.extend(i for batch in taken for i in batch.column(0).to_pylist())
    assert _count(stalls) == 2
    assert ids == list(range(BATCHES * ROWS))


@pytest.mark.usefixtures("no_stall")
def test_a_stream_counts_only_its_own_batches() -> None:
    """What else the process allocates from Arrow's system pool does not hold the stream back.

    Counted in the system pool itself, 64 MB allocated beside it kept the stream waiting.
    """
    pool = pa.system_memory_pool()
    beside: list[pa.Buffer] = []

    def allocate_once() -> None:
        if not beside:
            beside.append(pa.allocate_buffer(8 * BOUND, memory_pool=pool))

    found: list[tuple[list[int], list[int]]] = []
    done = _finished(
        lambda: found.append(_slow_write(bounded(_reader(), BOUND), None, allocate_once)), 60
    )
    assert done
    held, ids = found[0]
    assert max(held) <= 8 * BOUND + BOUND + BATCH_BYTES
    assert ids == list(range(BATCHES * ROWS))


def test_a_writer_that_keeps_every_batch_is_waited_on_twice() -> None:
    """A consumer that frees nothing (read_all) gets every row after two stalls, not a hang."""
    found: list[pa.Table] = []
    start = time.monotonic()
    assert _finished(lambda: found.append(bounded(_reader(), BOUND).read_all()), 30)
    assert 2 * handover.STALL_SECONDS <= time.monotonic() - start < 2 * handover.STALL_SECONDS + 5
    assert found[0].num_rows == BATCHES * ROWS
    assert found[0].column("id").to_pylist() == list(range(BATCHES * ROWS))


@pytest.mark.usefixtures("no_stall")
def test_delta_rs_frees_what_it_is_handed_as_it_writes(tmp_path: Path) -> None:
    """A real partitioned write under a bound of four batches, never let past it by a stall."""
    uri = str(tmp_path / "table")

    def write() -> None:
        write_deltalake(uri, bounded(_reader(), BOUND), partition_by=["day"])

    assert _finished(write, 120)
    stored = DeltaTable(uri).to_pyarrow_table()
    assert stored.num_rows == BATCHES * ROWS
    assert sorted(stored.column("id").to_pylist()) == list(range(BATCHES * ROWS))
