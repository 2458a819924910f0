"""Spark drivers in processes of their own: killed at random points, and racing for one day.

Each driver is a real process with its own JVM on the worker's Hive metastore. A kill takes its
whole process group (Python and the JVM it started, which would otherwise finish its work), at
a random moment of a stream of publishes; afterwards every partition must hold one version
whole, never a mix or nothing. Racing drivers are held at a barrier right before their commits.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from idem_assets.lib.backends.spark.locks import DATABASE, TABLE
from tests.reliability.support import REPORT, SEED, count
from tests.spark.writer import DAYS, ROWS

pytestmark = pytest.mark.slow

#: Kills in the everyday run, and under IDEM_FULL=1.
KILLS = count(3, 24)
ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def driver(spec: dict[str, Any]) -> Iterator[subprocess.Popen[str]]:
    """A writer process in a process group of its own; its group is killed on the way out."""
    log = Path(spec["warehouse"]).parent / f"driver-{random.random()}.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.spark.writer", json.dumps(spec)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
        text=True,
        start_new_session=True,
    )
    process.log = log  # type: ignore[attr-defined]
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)


def expect(process: subprocess.Popen[str], word: str, timeout: float = 240) -> str:
    """The driver's next line, which must start with ``word``."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    line = process.stdout.readline()
    assert time.monotonic() < deadline, f"the driver took over {timeout} s to say {word}"
    if not line.startswith(word):
        errors = [t for t in process.log.read_text().splitlines() if "Error" in t]  # type: ignore[attr-defined]
        raise AssertionError(f"expected {word!r}, got {line!r}: {errors[-5:]}")
    return line.strip()


def versions(spark: Any, schema: str) -> dict[str, tuple[int, list[float]]]:
    """Each day's row count and the versions its rows hold, read by a fresh query."""
    spark.catalog.refreshTable(f"{schema}.events")
    rows = spark.sql(
        f"SELECT idem_day, count(*), sort_array(collect_set(amount))"
        f" FROM {schema}.events GROUP BY 1"
    ).collect()
    return {r[0].isoformat(): (r[1], list(r[2])) for r in rows}


def spec(spark_conf: dict[str, str], schema: str, tmp_path: Path, **more: Any) -> dict[str, Any]:
    conf = {**spark_conf, "spark.local.dir": str(tmp_path / f"local-{random.random()}")}
    return {
        "conf": conf,
        "warehouse": str(tmp_path / "warehouse"),
        "schema": schema,
        "table": "events",
        **more,
    }


def test_a_driver_killed_at_random_points_leaves_every_day_old_or_new(
    spark: Any, spark_conf: dict[str, str], schema: str, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    with driver(spec(spark_conf, schema, tmp_path, version=1)) as first:
        expect(first, "start")
        expect(first, "committed")
    outcomes: dict[str, int] = {}
    for trial in range(KILLS):
        with driver(spec(spark_conf, schema, tmp_path, version=100 * (trial + 1))) as process:
            expect(process, "start")
            # Up to two publishes of the stream: any moment of one is as likely as any other.
            time.sleep(rng.uniform(0.0, 12.0))
            os.killpg(process.pid, signal.SIGKILL)
        # The killed driver may hold the table's lock: break it, as its operator would.
        spark.sql(
            f"ALTER TABLE {DATABASE}.{TABLE} DROP IF EXISTS PARTITION (name = '{schema}.events')"
        )
        found = versions(spark, schema)
        assert sorted(found) == DAYS, found
        assert all(n == ROWS and len(v) == 1 for n, v in found.values()), f"trial {trial}: {found}"
        # One range publish: its three days always hold the same version.
        assert len({v[0] for _, v in found.values()}) == 1, f"trial {trial}: {found}"
        kind = "old" if found[DAYS[0]][1][0] < 100 * (trial + 1) else "new"
        outcomes[kind] = outcomes.get(kind, 0) + 1
    REPORT.append(f"spark, SIGKILL of the driver's process group: {KILLS} kills, {outcomes}")


def test_two_drivers_overwriting_one_day_at_once_leave_one_batch(
    spark: Any, spark_conf: dict[str, str], schema: str, tmp_path: Path
) -> None:
    barrier = tmp_path / "go"
    with (
        driver(
            spec(spark_conf, schema, tmp_path, version=1, days=[DAYS[1]], barrier=str(barrier))
        ) as a,
        driver(
            spec(spark_conf, schema, tmp_path, version=2, days=[DAYS[1]], barrier=str(barrier))
        ) as b,
    ):
        for process in (a, b):
            expect(process, "start")
        for process in (a, b):
            expect(process, "held")
        barrier.touch()
        outcomes = [expect(p, "committed") for p in (a, b)]
    found = versions(spark, schema)
    assert list(found) == [DAYS[1]]
    count_, held = found[DAYS[1]]
    assert count_ == ROWS and held in ([1.0], [2.0]), (found, outcomes)
    REPORT.append(f"spark, two drivers overwriting one day: {outcomes} -> version {held}")
