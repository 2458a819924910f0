"""Load one window streamed in a fresh process and print its peak memory as JSON.

``python -m tests.lib.load_memory`` reads a pickled ``(open_backend, settings, warm, window,
memory)`` from stdin. It loads window ``warm`` first (the imports, the connection, a first
read), then ``window`` as an input typed ``pa.RecordBatchReader`` gets it: under the staging
limit ``memory``, drained into a Parquet file. It prints how far that load raised the peak, and
the rows it read with their size as Arrow.
"""

import json
import pickle
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

import idem_assets as ia
from idem_assets.lib.write.publish import spill_area
from idem_assets.lib.write.seam import Backend
from idem_assets.lib.write.streams import memory_limited, to_parquet
from tests.lib.stream_memory import peak


def drained(
    backend: Backend, settings: ia.WriteSettings, window: ia.WriteWindow, memory: str
) -> Path:
    """The window loaded streamed, as the IO manager loads it, in a Parquet file."""
    with memory_limited(spill_area(backend).conn, memory):
        reader = backend.load(settings, window, stream=True)
        assert isinstance(reader, pa.RecordBatchReader)
        return Path(to_parquet(reader))


def main() -> None:
    open_backend, settings, warm, window, memory = pickle.load(sys.stdin.buffer)
    with open_backend() as backend:
        drained(backend, settings, warm, memory).unlink()
        baseline = peak()
        path = drained(backend, settings, window, memory)
        increase = peak() - baseline
    read = pq.read_table(path)
    path.unlink()
    print(json.dumps({"peak_increase": increase, "rows": read.num_rows, "bytes": read.nbytes}))


if __name__ == "__main__":
    main()
