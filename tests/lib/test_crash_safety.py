"""A failure, or a killed process, between the delete and the insert leaves the old window."""

import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from idem_assets.lib.dagster_layer.frames import to_arrow

from .support import DAYS, count, partition_fingerprints, publish, settings, trips

STAGES = ["guards_passed", "deleted", "inserted", "before_commit"]
MODES = {
    "overwrite": ("overwrite", None),
    "merge": ("merge", None),
    "merge-keep-missing": (
        "merge",
        {"partition_expr": "pickup_at", "primary_key": ["trip_id"], "delete_missing": False},
    ),
}


class InjectedFault(Exception):
    """Raised by the stage hook to simulate a crash inside the transaction."""


def corrected(day: str) -> object:
    return trips(day).assign(fare=lambda df: df["fare"] + 1)


def load(db: Path) -> None:
    with duckdb.connect(str(db)) as conn:
        for day in DAYS:
            publish(conn, trips(day), settings("merge"), [day])


def test_publish_reports_every_stage_in_order(tmp_path: Path) -> None:
    load(tmp_path / "w.duckdb")
    seen: list[str] = []
    with duckdb.connect(str(tmp_path / "w.duckdb")) as conn:
        publish(
            conn,
            corrected("2026-01-02"),
            settings("overwrite"),
            ["2026-01-02"],
            on_stage=seen.append,
        )
    assert seen == STAGES


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_an_exception_at_any_stage_leaves_the_old_window(
    tmp_path: Path, stage: str, mode: tuple[str, dict | None]
) -> None:
    db = tmp_path / "w.duckdb"
    load(db)
    observed: dict[str, int] = {}

    def fail_at(reached: str) -> None:
        observed[reached] = count(conn, day="2026-01-02")
        if reached == stage:
            raise InjectedFault(reached)

    with duckdb.connect(str(db)) as conn:
        before = partition_fingerprints(conn)
        with pytest.raises(InjectedFault):
            publish(
                conn, corrected("2026-01-02"), settings(*mode), ["2026-01-02"], on_stage=fail_at
            )
        assert partition_fingerprints(conn) == before
        # The same connection still works: the retry publishes.
        publish(conn, corrected("2026-01-02"), settings(*mode), ["2026-01-02"])
        assert partition_fingerprints(conn) != before
        assert count(conn) == 3000
    if "deleted" in observed:
        assert observed["deleted"] == 0  # the hook really ran between the delete and the insert
    with duckdb.connect(str(db)) as conn:
        assert count(conn, day="2026-01-02") == 1000


KILL_SCRIPT = textwrap.dedent(
    """
    import os
    import sys

    import dagster as dg
    import duckdb
    import pyarrow.parquet as pq

    import idem_assets as ia

    db, batch_path, day, mode, stage = sys.argv[1:]
    settings = ia.resolve_settings(
        asset_key=dg.AssetKey(["trips"]),
        metadata={"partition_expr": "pickup_at", "primary_key": ["trip_id"]},
        mode=mode,
        default_schema="main",
        partitioned=True,
    )
    daily = dg.DailyPartitionsDefinition(start_date="2026-01-01")
    window = ia.window_from_keys(daily, [day], "trips")
    conn = duckdb.connect(db)

    def die(reached):
        if reached == stage:
            left = conn.execute(
                "SELECT count(*) FROM main.trips WHERE pickup_at >= ? AND pickup_at < ?",
                [window.start.replace(tzinfo=None), window.end.replace(tzinfo=None)],
            ).fetchall()[0][0]
            print(f"killed at {reached} with {left} rows in the window", flush=True)
            os._exit(1)

    ia.publish(conn, pq.read_table(batch_path), settings, window, on_stage=die)
    print("publish finished: the kill never happened", flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "stage", "rows_left"),
    [("overwrite", "deleted", 0), ("merge", "deleted", 0), ("overwrite", "before_commit", 1000)],
)
def test_a_process_killed_mid_publish_leaves_the_old_window(
    tmp_path: Path, mode: str, stage: str, rows_left: int
) -> None:
    db, batch = tmp_path / "w.duckdb", tmp_path / "batch.parquet"
    load(db)
    pq.write_table(to_arrow(corrected("2026-01-02"), "trips"), batch)
    with duckdb.connect(str(db)) as conn:
        before = partition_fingerprints(conn)
    script = tmp_path / "kill_mid_publish.py"
    script.write_text(KILL_SCRIPT)

    killed = subprocess.run(
        [sys.executable, str(script), str(db), str(batch), "2026-01-02", mode, stage],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert killed.returncode == 1, killed.stderr
    assert killed.stdout.strip() == f"killed at {stage} with {rows_left} rows in the window"
    with duckdb.connect(str(db)) as conn:
        assert partition_fingerprints(conn) == before
        assert count(conn) == 3000
        # A rerun after the crash publishes normally.
        result = publish(conn, pq.read_table(batch), settings(mode), ["2026-01-02"])
        assert result.rows == 1000
        assert partition_fingerprints(conn) != before
