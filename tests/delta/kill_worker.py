"""A child that publishes a streamed day to a Delta table and reports each step until killed."""

import multiprocessing.connection
import time

import idem_assets as ia
from idem_assets.lib.backends.delta.backend import DeltaBackend
from tests.helpers import NOW, settings, window
from tests.reliability.workers import read_batch


def publish_until_killed(
    root: str, batch_path: str, day: str, report: multiprocessing.connection.Connection
) -> None:
    """Publish the batch streamed over ``day``, sending every step; then wait to be killed.

    The steps are ``start``, ``staged`` (the day's file is written), each ``on_stage`` point and
    ``returned`` once publish() has.
    """
    batch = read_batch(batch_path)
    report.send_bytes(b"start")

    def progress(message: str) -> None:
        if message.startswith("Staged "):
            # Only the table's own data file is this test's: anything else is staged apart.
            own = "as a data file of the Delta table" in message
            report.send_bytes(b"staged" if own else b"staged apart")

    with DeltaBackend(root) as backend:
        ia.publish(
            backend,
            batch.to_reader(max_chunksize=10_000),
            settings("overwrite", {"partition_expr": "pickup_at"}),
            window(day),
            now=NOW,
            on_stage=lambda stage: report.send_bytes(stage.encode()),
            progress=progress,
        )
    report.send_bytes(b"returned")
    time.sleep(120)
