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


def test_a_writer_slower_than_the_reader_holds_at_most_the_bound() -> None:
    """A consumer taking every batch at once, freeing one every 5 ms, holds the bound and one batch.

    Handed over unbounded, it held nearly all 60 batches (96 MB) before freeing the first few.
    """
    pool = pa.system_memory_pool()
    before = pool.bytes_allocated()
    taken: deque[pa.RecordBatch] = deque()
    held: list[int] = []
    ids: list[int] = []
    done = threading.Event()

    def write() -> None:
        while not (done.is_set() and not taken):
            if taken:
                batch = taken.popleft()
                ids.extend(batch.column(0).to_pylist())
                del batch
            time.sleep(0.005)

    writer = threading.Thread(target=write)
    writer.start()
    for batch in bounded(_reader(), BOUND):
        taken.append(batch)
        held.append(pool.bytes_allocated() - before)
        del batch
    done.set()
    writer.join()
    assert max(held) <= BOUND + BATCH_BYTES, max(held)
    assert max(held) >= BOUND
    assert ids == list(range(BATCHES * ROWS))
    assert pool.bytes_allocated() == before


def test_a_writer_that_keeps_every_batch_is_waited_on_once() -> None:
    """A consumer that frees nothing (read_all) gets every row after one stall, not a hang."""
    found: list[pa.Table] = []
    start = time.monotonic()
    assert _finished(lambda: found.append(bounded(_reader(), BOUND).read_all()), 30)
    assert handover.STALL_SECONDS <= time.monotonic() - start < 3 * handover.STALL_SECONDS + 5
    assert found[0].num_rows == BATCHES * ROWS
    assert found[0].column("id").to_pylist() == list(range(BATCHES * ROWS))


def test_delta_rs_frees_what_it_is_handed_as_it_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real partitioned write under a bound of four batches, never let past it by a stall."""
    monkeypatch.setattr(handover, "STALL_SECONDS", 3600.0)
    uri = str(tmp_path / "table")

    def write() -> None:
        write_deltalake(uri, bounded(_reader(), BOUND), partition_by=["day"])

    assert _finished(write, 120)
    stored = DeltaTable(uri).to_pyarrow_table()
    assert stored.num_rows == BATCHES * ROWS
    assert sorted(stored.column("id").to_pylist()) == list(range(BATCHES * ROWS))
