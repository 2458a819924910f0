"""Streamed rows handed to delta-rs's writer a bounded amount at a time.

delta-rs reads a stream through DataFusion, which deals its batches round-robin to a task per CPU
before the day's one writer takes them back. While any task's queue is empty the stream is read
on, so the queue of a task waiting on the busy writer can grow without end: writing a 20M-row
day from a DuckDB reader peaked at 1.1-1.3 GB in 6 runs of 14, at 0.6-0.7 GB in the others.

So each batch is copied (one memcpy) into a memory pool of the stream's own (a proxy of
Arrow's system pool, so nothing else is counted there), and the next is handed over only once
that pool holds at most :data:`IN_FLIGHT` or two batches: what it holds is the batches
delta-rs has taken and not freed yet. Bounded so, 9 runs of 9 peaked at 0.6-0.7 GB, as fast.
"""

import threading
import time
from collections.abc import Iterator

import pyarrow as pa

#: What delta-rs may hold at once of the rows handed to it and not written yet.
IN_FLIGHT = 32 * 2**20
#: A writer that frees nothing for this long is let past the bound by one more :data:`IN_FLIGHT`
#: (a pause: a slow upload, a busy machine); stalled twice before it frees while a batch waits,
#: it keeps what it is given (or runs on the one tokio thread this wait holds): the rest of the
#: stream is handed over without waiting.
STALL_SECONDS = 1.0
_POLL_SECONDS = 0.002
#: Pools of streams that ended, empty: a buffer keeps a raw pointer to its pool, so a pool
#: lives as long as the process, and is reused by the next stream.
_IDLE: list[pa.MemoryPool] = []
_IDLE_LOCK = threading.Lock()


def bounded(reader: pa.RecordBatchReader, in_flight: int = IN_FLIGHT) -> pa.RecordBatchReader:
    """``reader``'s batches, each handed over once delta-rs holds at most ``in_flight`` of them."""
    return pa.RecordBatchReader.from_batches(reader.schema, _handed(reader, in_flight))


def _handed(reader: pa.RecordBatchReader, in_flight: int) -> Iterator[pa.RecordBatch]:
    pool = _pool()
    try:
        # Past a stall the bound counts from what was held then, and is whole again once the
        # writer frees while this waits. A writer that frees only between waits (a runtime of
        # one thread, which this wait holds) or never stalls it twice: then it is gone for good.
        base = stalls = 0
        for batch in reader:
            # Room for two batches at least, or wide ones would be written one at a time.
            limit = base + max(in_flight, 2 * batch.nbytes)
            if stalls < 2:
                freed = _freed(pool)
                if not _room(pool, limit):
                    base, stalls = pool.bytes_allocated(), stalls + 1
                elif _freed(pool) > freed:
                    base = stalls = 0
            # Yielded unnamed: this frame keeps no reference to what delta-rs has taken.
            yield pa.RecordBatch.from_arrays(
                [pa.concat_arrays([column], memory_pool=pool) for column in batch.columns],
                schema=batch.schema,
            )
    finally:
        _release(pool)


def _pool() -> pa.MemoryPool:
    """An empty pool of this stream's own."""
    with _IDLE_LOCK:
        for i, pool in enumerate(_IDLE):
            if pool.bytes_allocated() == 0:
                return _IDLE.pop(i)
    return pa.proxy_memory_pool(pa.system_memory_pool())


def _release(pool: pa.MemoryPool) -> None:
    with _IDLE_LOCK:
        _IDLE.append(pool)


def _freed(pool: pa.MemoryPool) -> int:
    """The bytes delta-rs has freed of what ``pool`` gave this stream."""
    return pool.total_bytes_allocated() - pool.bytes_allocated()


def _room(pool: pa.MemoryPool, limit: int) -> bool:
    """Wait until ``pool`` holds at most ``limit`` bytes; ``False`` if it stopped freeing any."""
    last, since = pool.bytes_allocated(), time.monotonic()
    while (held := pool.bytes_allocated()) > limit:
        if held < last:
            last, since = held, time.monotonic()
        elif time.monotonic() - since > STALL_SECONDS:
            return False
        time.sleep(_POLL_SECONDS)
    return True
