"""Streamed rows handed to delta-rs's writer a bounded amount at a time.

delta-rs reads a stream through DataFusion, which deals its batches round-robin to a task per CPU
before the day's one writer takes them back. While any task's queue is empty the stream is read
on, so the queue of a task waiting on the busy writer can grow without end: writing a 20M-row
day from a DuckDB reader peaked at 1.1-1.3 GB in 6 runs of 14, at 0.6-0.7 GB in the others.

So each batch is copied (one memcpy) into Arrow's system memory pool, which pyarrow allocates
nothing else from by default, and the next is handed over only once the pool holds at most
:data:`IN_FLIGHT` more than when the stream began: what it holds is the batches delta-rs has
taken and not freed yet. Bounded so, 9 runs of 9 peaked at 0.6-0.7 GB, as fast.
"""

import time
from collections.abc import Iterator

import pyarrow as pa

#: What delta-rs may hold at once of the rows handed to it and not written yet.
IN_FLIGHT = 32 * 2**20
#: A writer that frees nothing for this long keeps what it is given (a merge's hash join, one
#: thread left to run it): the rest of the stream is handed over without waiting.
STALL_SECONDS = 1.0
_POLL_SECONDS = 0.002


def bounded(reader: pa.RecordBatchReader, in_flight: int = IN_FLIGHT) -> pa.RecordBatchReader:
    """``reader``'s batches, each handed over once delta-rs holds at most ``in_flight`` of them."""
    return pa.RecordBatchReader.from_batches(reader.schema, _handed(reader, in_flight))


def _handed(reader: pa.RecordBatchReader, in_flight: int) -> Iterator[pa.RecordBatch]:
    pool = pa.system_memory_pool()
    before = pool.bytes_allocated()
    waiting = True
    for batch in reader:
        if waiting:
            # Room for two batches at least, or wide ones would be written one at a time.
            waiting = _room(pool, before + max(in_flight, 2 * batch.nbytes))
        # Yielded unnamed: this frame keeps no reference to what delta-rs has taken.
        yield pa.RecordBatch.from_arrays(
            [pa.concat_arrays([column], memory_pool=pool) for column in batch.columns],
            schema=batch.schema,
        )


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
