"""Code that runs in child processes: writers materialising one asset at once, on any engine.

Each writer is a real process running ``dg.materialize`` with an engine's IO manager. Its first
attempt waits right before its commit until every writer has reached its own, so all of them
decided on the same state of the store; an engine that makes writers wait for each other (a
file lock, a row lock) keeps the others from arriving, and the wait ends after
:data:`HOLD_S`.
"""

import multiprocessing.connection
import os
import threading
import traceback
from collections.abc import Mapping
from typing import Any

import dagster as dg
import pyarrow as pa

from idem_assets.lib.write.publish import STAGE_HOOK
from tests.conformance.conftest import io_managers
from tests.conformance.test_replace_contract import EVENTS, events
from tests.helpers import DAILY

#: How long a writer at the barrier waits for the others before it commits anyway.
HOLD_S = 2.0
#: Rows in each writer's day.
ROWS = 500


def batch(day: str, version: int, variant: str) -> pa.Table:
    """A writer's batch: ``plain`` events of ``day``, ``tip`` with an extra column, ``shared``
    with ids that every day's batch holds, ``fewer`` with a tenth of the ids missing."""
    found = events(day, rows=ROWS, version=version)
    if variant == "tip":
        return found.append_column("tip", pa.array([0.5 + version] * ROWS))
    if variant == "shared":
        return found.set_column(0, "event_id", pa.array(range(ROWS), pa.int64()))
    if variant == "fewer":
        return found.slice(0, ROWS - ROWS // 10)
    return found


def materialize_at_once(
    engine: str,
    config: Mapping[str, Any],
    env: Mapping[str, str],
    table: str,
    mode: str,
    day: str,
    version: int,
    variant: str,
    barrier: threading.Barrier,
    report: multiprocessing.connection.Connection,
    streamed: bool = False,
) -> None:
    """Materialise ``day`` of asset ``table`` (events) and report ``(outcome, attempts, detail)``.

    ``streamed``: the asset returns its batch as a RecordBatchReader, staged before the guards.

    ``outcome`` is ``committed`` (``detail``: the materialization's metadata) or ``refused``
    (``detail``: the error's class and message); ``attempts`` counts the publishes that passed
    the guards (a lost optimistic commit starts over).
    """
    try:
        # Dagster's console log of every run would bury the test's output; the outcome and
        # any traceback travel on ``report``.
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        os.environ.update(env)
        tries: list[str] = []

        def hold(stage: str) -> None:
            if stage == "guards_passed":
                tries.append(stage)
            if stage == "before_commit" and len(tries) == 1:
                try:
                    barrier.wait(HOLD_S)
                except threading.BrokenBarrierError:
                    pass  # another writer waits for this one's lock, or is done

        @dg.asset(
            name=table,
            partitions_def=DAILY,
            io_manager_key="merge_io_manager" if mode == "merge" else "io_manager",
            metadata=EVENTS,
        )
        def source() -> Any:
            found = batch(day, version, variant)
            return found.to_reader() if streamed else found

        STAGE_HOOK.set(hold)
        try:
            result = dg.materialize(
                [source], resources=io_managers(engine, config), partition_key=day
            )
        except Exception as exc:
            report.send(("refused", len(tries), (type(exc).__name__, str(exc))))
            return
        metadata = result.get_asset_materialization_events()[0].materialization.metadata
        plain = {k: v.value for k, v in metadata.items() if isinstance(v.value, int | str)}
        report.send(("committed", len(tries), plain))
    except BaseException:
        report.send(("crashed", 0, traceback.format_exc()))
    finally:
        report.close()
