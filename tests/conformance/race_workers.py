"""Code that runs in child processes: writers of any engine held at a barrier before their commits.

Children come from the reliability suite's forkserver (Arrow and idem_assets already imported).
"""

import multiprocessing.connection
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import idem_assets as ia
from idem_assets.lib.write.seam import Backend
from tests.helpers import NOW, settings, window
from tests.reliability.workers import read_batch

#: How long a writer at the barrier waits for the other before it commits alone.
BARRIER_S = 60.0


def publish_at_barrier(
    open_backend: Callable[[], AbstractContextManager[Backend]],
    batch_path: str,
    mode: str,
    metadata: dict[str, Any],
    table: str,
    keys: Sequence[str],
    barrier: Any,
    report: multiprocessing.connection.Connection,
    streamed: bool = False,
) -> None:
    """Publish one batch; the first time it reaches ``before_commit``, wait at ``barrier``.

    ``streamed``: the batch is sent as a RecordBatchReader, staged before the guards judge it.

    Reports ``("held", "", "")`` on reaching the barrier, then ``("committed", rows, "")`` or
    ``("error", class name, message)``. A broken (aborted) barrier lets the writer go on.
    """
    held = False

    def on_stage(stage: str) -> None:
        nonlocal held
        if stage == "before_commit" and not held:
            held = True
            report.send(("held", "", ""))
            try:
                barrier.wait(BARRIER_S)
            except threading.BrokenBarrierError:
                pass

    try:
        batch = read_batch(batch_path)
        with open_backend() as backend:
            result = ia.publish(
                backend,
                batch.to_reader() if streamed else batch,
                settings(mode, metadata, table=table),
                window(*keys),
                now=NOW,
                on_stage=on_stage,
            )
        report.send(("committed", result.rows, ""))
    except Exception as exc:
        report.send(("error", type(exc).__name__, str(exc)))
    finally:
        report.close()
