"""A Spark driver in a process of its own that publishes until it is killed, or races another.

Run as ``python -m tests.spark.writer '<json>'``: it opens its own session on the test's Hive
metastore, then publishes the three days of ``table`` as one range, version after version,
printing ``start`` once its session is up and ``committed <version>`` after each publish. With
``"barrier"`` set it publishes once, announcing ``held`` when it reaches the commit and waiting
there until the barrier file exists.
"""

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa

import idem_assets as ia
from idem_assets.lib.backends.spark.backend import SparkBackend
from idem_assets.lib.backends.spark.session import spark_session
from tests.helpers import NOW, settings, window

DAYS = ["2026-01-01", "2026-01-02", "2026-01-03"]
ROWS = 200
METADATA: dict[str, Any] = {"partition_expr": "event_at", "primary_key": ["event_id"]}


def batch(days: list[str], version: int, rows: int = ROWS) -> pa.Table:
    """``rows`` events a day; ``amount`` is the version, so a partition tells which it holds."""
    from tests.conformance.test_replace_contract import events

    found = pa.concat_tables([events(day, rows=rows) for day in days])
    return found.set_column(2, "amount", pa.array([float(version)] * found.num_rows))


def main(spec: dict[str, Any]) -> None:
    spark = spark_session(spec["conf"])
    backend = SparkBackend(spark, spec["warehouse"])
    write = replace(
        settings(spec.get("mode", "overwrite"), METADATA, table=spec["table"]),
        schema=spec["schema"],
    )
    days = spec.get("days", DAYS)
    print("start", flush=True)
    barrier = spec.get("barrier")

    held = []

    def on_stage(stage: str) -> None:
        # Only the first attempt waits: one that lost the commit starts over on its own.
        if barrier and stage == "before_commit" and not held:
            held.append(stage)
            print("held", flush=True)
            deadline = time.monotonic() + 120
            while not Path(barrier).exists() and time.monotonic() < deadline:
                time.sleep(0.05)

    version = spec.get("version", 1)
    while True:
        try:
            ia.publish(
                backend, batch(days, version), write, window(*days), now=NOW, on_stage=on_stage
            )
        except ia.IdempotencyError as exc:
            print("refused", type(exc).__name__, json.dumps(str(exc)), flush=True)
            return
        print("committed", version, flush=True)
        if barrier:
            return
        version += 1


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
