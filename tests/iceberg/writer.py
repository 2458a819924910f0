"""A process that publishes to an Iceberg table, racing others or killed mid-publish.

``python -m tests.iceberg.writer LOCATION JOB BARRIER PARTIES`` runs JOB, a JSON object: ``mode``
(overwrite or merge), ``day`` and ``version`` of the events it publishes, optionally ``ids`` (the
batch's ``event_id`` values, for keys two writers share) and ``rows``. LOCATION is the catalog
as JSON (:func:`location_json`). The first attempt waits right before its commit until PARTIES
writers have reached theirs (files in the directory BARRIER), so all decided on one snapshot.
With PARTIES 0 it prints ``ready`` and waits for a line on stdin first (a kill trial). It prints
one JSON line: the outcome, the attempts it took and, on a refusal, the error's class.
"""

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

import idem_assets as ia
from idem_assets.lib.backends.iceberg.backend import IcebergBackend
from idem_assets.lib.backends.iceberg.catalog import IcebergLocation
from tests.conformance.test_replace_contract import EVENTS, events
from tests.helpers import NOW, settings, window


def location_json(location: IcebergLocation) -> str:
    """The catalog as a writer's first argument (the password stays in the environment)."""
    return json.dumps(
        {
            "uri": location.uri,
            "warehouse": location.warehouse,
            "password_env": location.password_env,
        }
    )


def batch(job: dict[str, Any]) -> pa.Table:
    """The job's events: a day of them, their ids replaced when the job names ids."""
    found = events(job["day"], rows=job.get("rows", 1000), version=job["version"])
    if "ids" in job:
        found = found.slice(0, len(job["ids"]))
        found = found.set_column(0, "event_id", pa.array(job["ids"], pa.int64()))
    return found


def wait_for_everyone(barrier: Path, parties: int) -> None:
    """Arrive at the barrier, then wait (at most 60 s) until every writer has."""
    barrier.mkdir(parents=True, exist_ok=True)
    (barrier / str(os.getpid())).touch()
    deadline = time.monotonic() + 60
    while len(list(barrier.iterdir())) < parties and time.monotonic() < deadline:
        time.sleep(0.01)


def main(location: IcebergLocation, job: dict[str, Any], barrier: Path, parties: int) -> dict:
    """Publish the job; report what happened."""
    tries: list[str] = []

    def on_stage(stage: str) -> None:
        if stage == "guards_passed":
            tries.append(stage)
        if stage == "before_commit" and len(tries) == 1 and parties:
            wait_for_everyone(barrier, parties)

    rows = batch(job)
    with IcebergBackend(location) as backend:
        if not parties:
            print("ready", flush=True)
            sys.stdin.readline()
        start = time.perf_counter()
        try:
            result = ia.publish(
                backend,
                rows,
                settings(job["mode"], EVENTS, table=job.get("table", "events")),
                window(job["day"]),
                now=NOW,
                on_stage=on_stage,
                attempts=job.get("attempts", 3),
            )
        except ia.IdempotencyError as exc:
            found = {"outcome": "refused", "error": type(exc).__name__, "message": str(exc)}
            return {**found, "attempts": len(tries)}
        seconds = time.perf_counter() - start
        return {
            "outcome": "committed",
            "attempts": len(tries),
            "rows": result.rows,
            "seconds": seconds,
        }


if __name__ == "__main__":
    where, job, barrier, parties = sys.argv[1:5]
    found = main(IcebergLocation(**json.loads(where)), json.loads(job), Path(barrier), int(parties))
    print(json.dumps(found), flush=True)
