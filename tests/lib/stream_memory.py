"""Publish one day in a fresh process and print its peak memory as JSON (tests/lib/test_streams).

``python -m tests.lib.stream_memory DB stream|table ROWS``: the rows come from a generator of
100,000-row batches; ``stream`` publishes them as a RecordBatchReader under a 64 MB staging
limit, ``table`` as one Arrow table, as the in-memory path takes a batch.
"""

import json
import sys
from collections.abc import Iterator

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import idem_assets as ia
from tests.helpers import NOW, settings, window

BATCH = 100_000
START = np.datetime64("2026-01-02T00:00:00", "us")
DAY_US = 86_400_000_000


def batches(rows: int) -> Iterator[pa.RecordBatch]:
    """``rows`` trips of 2026-01-02 in batches, each made when it is asked for."""
    rng = np.random.default_rng(7)
    base = rng.integers(0, DAY_US, BATCH)
    for first in range(0, rows, BATCH):
        n = min(BATCH, rows - first)
        ids = np.arange(first, first + n, dtype=np.int64)
        yield pa.record_batch(
            {
                "trip_id": ids,
                "pickup_at": pa.array(START + base[:n].astype("timedelta64[us]")),
                "fare": pc.multiply(pa.array(ids % 97, pa.float64()), 0.5),
                "zone": pa.array((ids % 263).astype(np.int32)),
                "passengers": pa.array((ids % 5).astype(np.int64)),
            }
        )


def peak() -> int:
    """This process's own peak RSS in bytes.

    VmHWM belongs to the process's address space, made new at exec; ru_maxrss is not: it keeps
    the peak of the parent at fork (a pytest worker's gigabyte), which hid the publish's own.
    """
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main() -> None:
    db, how, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
    first = next(batches(BATCH))
    conn = duckdb.connect(db)
    write = settings("overwrite", {"partition_expr": "pickup_at"})
    # Warm: the imports, the connection and one small publish, before the baseline.
    ia.publish(conn, pa.Table.from_batches([first]), write, window("2026-01-02"), now=NOW)
    baseline = peak()
    if how == "stream":
        source = pa.RecordBatchReader.from_batches(first.schema, batches(rows))
        ia.publish(conn, source, write, window("2026-01-02"), now=NOW, memory="64MB")
    else:
        table = pa.Table.from_batches(list(batches(rows)))
        ia.publish(conn, table, write, window("2026-01-02"), now=NOW)
    increase = peak() - baseline
    stored = conn.execute("SELECT count(*) FROM main.trips").fetchall()[0][0]
    size = sum(b.nbytes for b in batches(rows))
    fingerprint = ia.table_fingerprint(conn, "main", "trips")
    print(
        json.dumps(
            {
                "peak_increase": increase,
                "batch_bytes": size,
                "stored": stored,
                "fingerprint": fingerprint,
            }
        )
    )


if __name__ == "__main__":
    main()
