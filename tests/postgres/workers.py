"""Code that runs in child processes: Postgres writers that race, and a reader.

Children come from the reliability suite's forkserver, which has already imported Arrow and
idem_assets, so starting one costs milliseconds.
"""

import multiprocessing.connection
import multiprocessing.synchronize
import time
import traceback
from collections.abc import Sequence
from typing import Any

import idem_assets as ia
from idem_assets.lib.backends.postgres.backend import PostgresBackend, PostgresLocation
from tests.helpers import NOW, TRIPS_METADATA, settings, window
from tests.reliability.workers import read_batch

#: How long a held writer waits for the test to release it before it goes on by itself.
HOLD_S = 60.0


def publish_held(
    location: PostgresLocation,
    batch_path: str,
    mode: str,
    keys: Sequence[str],
    hold_at: str | None,
    release: multiprocessing.synchronize.Event,
    report: multiprocessing.connection.Connection,
    metadata: dict[str, Any] = TRIPS_METADATA,
) -> None:
    """Publish one batch; at ``hold_at`` wait (inside the transaction) until ``release``.

    Reports ``("pid", backend_pid, t)``, ``("stage", name, t)`` at each stage, then
    ``("committed", rows, t)`` or ``("error", traceback, t)``; ``t`` is ``time.time()``.
    """
    try:
        batch = read_batch(batch_path)
        with PostgresBackend.connect(location) as backend:
            backend.cur.execute("SELECT pg_backend_pid()")
            report.send(("pid", backend.cur.fetchall()[0][0], time.time()))

            def on_stage(stage: str) -> None:
                report.send(("stage", stage, time.time()))
                if stage == hold_at:
                    release.wait(HOLD_S)

            result = ia.publish(
                backend,
                batch,
                settings(mode, metadata),
                window(*keys),
                now=NOW,
                on_stage=on_stage,
            )
        report.send(("committed", result.rows, time.time()))
    except BaseException:
        report.send(("error", traceback.format_exc(), time.time()))
