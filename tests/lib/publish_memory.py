"""Publish one streamed day through any backend in a fresh process and print its peaks as JSON.

``python -m tests.lib.publish_memory`` reads a pickled ``(open_backend, rows, memory, mode)``
from stdin. It publishes a first small day streamed (the imports, the store, the engine's writer
started once), then ``rows`` trips of the same day as a RecordBatchReader staged under
``memory``, both with ``mode`` ("overwrite", or "merge" on ``trip_id``: the day's first trips
updated, the others inserted). It prints the process's peak, how far that publish raised it,
how far its commit alone raised it (from the process's size as the commit began), the batch's
size as Arrow, the most the batches handed to a writer held at once (Delta Lake's,
:mod:`idem_assets.lib.backends.delta.handover`), and the day's rows and fingerprint as stored.
"""

import json
import pickle
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

import idem_assets as ia
from idem_assets.lib.write.seam import TableRef
from tests.helpers import NOW, settings, window
from tests.lib.stream_memory import BATCH, peak

DAY = "2026-01-02"
START = np.datetime64(f"{DAY}T00:00:00", "us")
DAY_US = 86_400_000_000


def batches(rows: int) -> Iterator[pa.RecordBatch]:
    """``rows`` trips of the day in batches of random times and fares, as real trips have.

    Values that seldom repeat are what Parquet encodes slowest: the writer falls behind the
    staged copy it reads.
    """
    rng = np.random.default_rng(7)
    for first in range(0, rows, BATCH):
        n = min(BATCH, rows - first)
        yield pa.record_batch(
            {
                "trip_id": np.arange(first, first + n, dtype=np.int64),
                "pickup_at": pa.array(START + rng.integers(0, DAY_US, n).astype("timedelta64[us]")),
                "fare": pa.array(rng.gamma(2.0, 8.0, n)),
                "distance_km": pa.array(rng.gamma(2.0, 2.0, n)),
                "zone": pa.array(rng.integers(1, 264, n).astype(np.int32)),
            }
        )


def resident() -> int:
    """This process's size now in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> None:
    open_backend, rows, memory, mode = pickle.load(sys.stdin.buffer)
    key = {"primary_key": ["trip_id"]} if mode == "merge" else {}
    write = settings(mode, {"partition_expr": "pickup_at", **key})
    first = next(batches(BATCH))
    before_commit: list[int] = []
    staged_peak: list[int] = []

    def on_stage(stage: str) -> None:
        if stage == "before_commit":
            staged_peak.append(peak())
            # Writing 5 resets the peak to the size now (Linux >= 4.0): what follows is the
            # commit's own.
            Path("/proc/self/clear_refs").write_text("5")
            before_commit.append(resident())

    with open_backend() as backend:
        warm = pa.RecordBatchReader.from_batches(first.schema, batches(BATCH))
        ia.publish(backend, warm, write, window(DAY), now=NOW, memory=memory)
        baseline = peak()
        source = pa.RecordBatchReader.from_batches(first.schema, batches(rows))
        ia.publish(backend, source, write, window(DAY), now=NOW, memory=memory, on_stage=on_stage)
        increase = max(peak(), *staged_peak) - baseline
        commit = peak() - before_commit[-1]
        found = backend.fingerprint(TableRef("main", "trips"), "pickup_at", window(DAY))
        fingerprint = ia.table_fingerprint(backend, "main", "trips", "pickup_at", window(DAY))
    size = sum(b.nbytes for b in batches(rows))
    print(
        json.dumps(
            {
                "peak": max(peak(), *staged_peak),
                "peak_increase": increase,
                "commit_increase": commit,
                "batch_bytes": size,
                # What the pool a writer is handed batches in ever held (Delta Lake's commit).
                "handed_peak": pa.system_memory_pool().max_memory(),
                "stored": found[0] if found else None,
                "fingerprint": fingerprint,
            }
        )
    )


if __name__ == "__main__":
    main()
