"""A process that publishes one partition to a Delta table, racing others.

``python -m tests.delta.writer ROOT KEY VERSION BARRIER PARTIES [ATTEMPTS]`` publishes KEY at
VERSION: a day of events, or a region (``north``) of the statically partitioned sales. Its first
attempt waits, just before its commit, until PARTIES writers have reached theirs (files in the
directory BARRIER), so all of them decided on the same table version and commit at once. It prints
one JSON line: the outcome, the attempts it took and, on a refusal, the error's class.
"""

import json
import os
import sys
import time
from pathlib import Path

import pyarrow as pa

import idem_assets as ia
from idem_assets.lib.backends.delta.backend import DeltaBackend
from tests.conformance.test_partition_kinds import DAYS, ONE_DIM, REGIONS, STATIC, sales
from tests.conformance.test_replace_contract import EVENTS, events
from tests.helpers import NOW, settings, window


def work(key: str, version: int) -> tuple[ia.WriteSettings, ia.WriteWindow, pa.Table]:
    """What a writer of ``key`` publishes: a region's sales, or a day's events."""
    if key in REGIONS:
        found = settings("overwrite", ONE_DIM, table="sales", partitions_def=STATIC)
        return found, ia.window_from_keys(STATIC, [key], "sales"), sales(DAYS[0], key, version)
    return settings("overwrite", EVENTS, table="events"), window(key), events(key, version=version)


def wait_for_everyone(barrier: Path, parties: int) -> None:
    """Arrive at the barrier, then wait (at most 60 s) until every writer has."""
    barrier.mkdir(parents=True, exist_ok=True)
    (barrier / str(os.getpid())).touch()
    deadline = time.monotonic() + 60
    while len(list(barrier.iterdir())) < parties and time.monotonic() < deadline:
        time.sleep(0.01)


def main(root: str, key: str, version: int, barrier: Path, parties: int, attempts: int) -> dict:
    """Publish ``key`` at ``version``; report what happened."""
    tries: list[str] = []

    def on_stage(stage: str) -> None:
        if stage == "guards_passed":
            tries.append(stage)
        if stage == "before_commit" and len(tries) == 1:
            wait_for_everyone(barrier, parties)

    publish_settings, publish_window, batch = work(key, version)
    with DeltaBackend(root) as backend:
        try:
            result = ia.publish(
                backend,
                batch,
                publish_settings,
                publish_window,
                now=NOW,
                on_stage=on_stage,
                attempts=attempts,
            )
        except ia.IdempotencyError as exc:
            found = {"outcome": "refused", "error": type(exc).__name__, "message": str(exc)}
            return {**found, "attempts": len(tries)}
        return {"outcome": "committed", "attempts": len(tries), "rows": result.rows}


if __name__ == "__main__":
    root, key, version, barrier, parties, *rest = sys.argv[1:]
    attempts = int(rest[0]) if rest else 3
    found = main(root, key, int(version), Path(barrier), int(parties), attempts)
    print(json.dumps(found), flush=True)
    # delta-rs's runtime threads can abort the interpreter's teardown; the result is out.
    os._exit(0)
