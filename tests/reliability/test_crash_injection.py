"""SIGKILL a publishing process at random moments: every partition is its old or its new state.

Each trial copies a warehouse of eight days, starts a child that publishes a correction (one day
or a chunk of days, overwrite or merge, or the first write that creates a table) and kills it
with SIGKILL after a random delay, or a random delay after a random stage of the transaction. The
parent then opens the file (DuckDB replays its WAL) and compares fingerprints per partition.
Trials are seeded: ``IDEM_SEED=<n>`` replays the same choices (the exact instant a kill lands
still depends on the machine's timing).
"""

import os
import random
import shutil
import signal
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pytest

import idem_assets as ia

from .support import (
    METADATA,
    NOW,
    REPORT,
    SEED,
    TABLE,
    count,
    days,
    partition_fingerprints,
    range_batch,
    settings,
    window,
)
from .workers import Child, context, publish_until_killed, read_batch, write_batch

ALL_DAYS = days("2026-01-01", 8)
ROWS_PER_DAY = 20_000
STAGES = ("guards_passed", "deleted", "inserted", "before_commit", "committed")
TRIALS_PER_SCENARIO = count(5, 50)


@dataclass(frozen=True)
class Scenario:
    """One kind of publish to kill: its mode, window and target table."""

    mode: str
    keys: tuple[str, ...]
    table: str = TABLE
    metadata: dict[str, Any] = field(default_factory=lambda: dict(METADATA))
    duplicates: int = 0
    #: Sent as a RecordBatchReader: inserted into its table inside the transaction.
    streamed: bool = False

    @property
    def stages(self) -> tuple[str, ...]:
        """The steps a kill may follow."""
        return ("staged in its table", *STAGES) if self.streamed else STAGES


SCENARIOS = {
    "overwrite-single": Scenario("overwrite", ("2026-01-03",)),
    "overwrite-chunk": Scenario("overwrite", tuple(days("2026-01-03", 4))),
    "merge-single": Scenario("merge", ("2026-01-04",)),
    # Re-sent duplicates make the merge deduplicate inside the transaction.
    "merge-chunk": Scenario(
        "merge",
        tuple(days("2026-01-02", 4)),
        metadata={**METADATA, "dedupe_order_by": ["updated_at"]},
        duplicates=200,
    ),
    # The first write of a table: CREATE TABLE is inside the transaction too.
    "create-chunk": Scenario("overwrite", tuple(days("2026-01-05", 3)), table="fresh_trips"),
    # A stream over an existing table goes into the table itself, then the guards judge it.
    "overwrite-streamed": Scenario("overwrite", ("2026-01-03",), streamed=True),
    "merge-streamed": Scenario("merge", ("2026-01-04",), streamed=True),
}

#: Kills per outcome, over every scenario of the session, for the report.
OUTCOMES: Counter[str] = Counter()
LAST_STEP: Counter[str] = Counter()


def state(db: Path) -> dict[str, Any]:
    """What a reader sees: fingerprints per day of both tables, and every table in the file."""
    with duckdb.connect(str(db)) as conn:
        return {
            "trips": partition_fingerprints(conn, ALL_DAYS),
            "fresh_trips": partition_fingerprints(conn, ALL_DAYS, "fresh_trips"),
            "whole": (
                ia.table_fingerprint(conn, "main", "trips"),
                ia.table_fingerprint(conn, "main", "fresh_trips"),
            ),
            "tables": conn.execute(
                "SELECT schema_name, table_name, temporary FROM duckdb_tables() ORDER BY ALL"
            ).fetchall(),
            "views": conn.execute(
                "SELECT view_name FROM duckdb_views() WHERE NOT internal"
            ).fetchall(),
        }


@pytest.fixture(scope="module", autouse=True)
def report_totals() -> Iterator[None]:
    """After the module: kills per outcome and per last step reached, over every scenario."""
    yield
    total = sum(OUTCOMES.values())
    if total:
        REPORT.append(
            f"crash total: {total} SIGKILLs; "
            + ", ".join(f"{n} {o}" for o, n in sorted(OUTCOMES.items()))
        )
        REPORT.append(
            "crash last step reported before the kill: "
            + ", ".join(f"{step} {n}" for step, n in LAST_STEP.most_common())
        )


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A warehouse file holding eight days of 20,000 trips (version 0)."""
    db = tmp_path_factory.mktemp("crash") / "template.duckdb"
    with duckdb.connect(str(db)) as conn:
        ia.publish(
            conn, range_batch(ALL_DAYS, ROWS_PER_DAY), settings(), window(*ALL_DAYS), now=NOW
        )
    return db


def start(db: Path, batch: Path, scenario: Scenario, checkpoint_threshold: str) -> Child:
    ctx = context()
    reader, writer = ctx.Pipe(duplex=False)
    process = ctx.Process(
        target=publish_until_killed,
        args=(
            str(db),
            str(batch),
            scenario.mode,
            scenario.metadata,
            list(scenario.keys),
            scenario.table,
            checkpoint_threshold,
            writer,
            scenario.streamed,
        ),
        daemon=True,
    )
    process.start()
    writer.close()
    child = Child(process, reader)
    assert child.wait_for("start", 60), f"the child never started: {child.steps}"
    return child


@pytest.fixture
def scenario_files(
    request: pytest.FixtureRequest, template: Path, tmp_path: Path
) -> Iterator[tuple[Scenario, Path, dict[str, Any], dict[str, Any]]]:
    """The scenario, its batch file, and the old and new states of the warehouse."""
    scenario = SCENARIOS[request.param]
    batch = range_batch(scenario.keys, ROWS_PER_DAY, version=1, duplicates=scenario.duplicates)
    batch_path = tmp_path / "batch.arrow"
    write_batch(str(batch_path), batch)
    old = state(template)
    expected = tmp_path / "expected.duckdb"
    shutil.copy(template, expected)
    with duckdb.connect(str(expected)) as conn:
        ia.publish(
            conn,
            batch,
            settings(scenario.mode, scenario.metadata, table=scenario.table),
            window(*scenario.keys),
            now=NOW,
        )
    new = state(expected)
    table = scenario.table
    # Every partition of the window changes (and only those); "0:..." is an empty partition.
    changed = [
        k for k in ALL_DAYS if old[table][k] != new[table][k] and not new[table][k].startswith("0:")
    ]
    assert changed == list(scenario.keys)
    yield scenario, batch_path, old, new


@pytest.mark.slow
@pytest.mark.parametrize("scenario_files", list(SCENARIOS), indirect=True)
def test_sigkill_at_random_moments_leaves_each_partition_old_or_new(
    scenario_files: tuple[Scenario, Path, dict[str, Any], dict[str, Any]],
    template: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    scenario, batch_path, old, new = scenario_files
    name = request.node.callspec.id
    db = tmp_path / "w.duckdb"

    # Calibrate: how long this publish takes here, start to commit and start to closed.
    to_commit, to_close = [], []
    for _ in range(2):
        shutil.copy(template, db)
        child = start(db, batch_path, scenario, "16MB")
        began = time.monotonic()
        assert child.wait_for("committed", 60), child.steps
        to_commit.append(time.monotonic() - began)
        assert child.wait_for("closed", 60), child.steps
        to_close.append(time.monotonic() - began)
        child.kill()
        assert state(db) == new
        assert set(scenario.stages) <= set(child.steps), child.steps
    commit_s, close_s = statistics.median(to_commit), statistics.median(to_close)

    rng = random.Random(f"{SEED}/{name}")
    outcomes: Counter[str] = Counter()
    for trial in range(TRIALS_PER_SCENARIO):
        shutil.copy(template, db)
        Path(f"{db}.wal").unlink(missing_ok=True)
        threshold = rng.choice(["16MB", "1KB"])  # 1KB: the commit itself checkpoints
        if rng.random() < 0.5:
            stage, fraction = None, rng.uniform(0, 1.2)
            delay = fraction * close_s
            how = f"{delay * 1000:.1f} ms ({fraction:.2f} x publish and close) after start"
        else:
            stage = rng.choice(scenario.stages)
            delay = rng.uniform(0, 0.3) * commit_s
            how = f"{delay * 1000:.1f} ms after {stage}"
        child = start(db, batch_path, scenario, threshold)
        if stage is None:
            child.wait_for(None, delay)
        else:
            reached = child.wait_for(stage, 60)
            assert reached, (
                f"{name} trial {trial} never reached {stage}: {child.steps}, seed {SEED}"
            )
            time.sleep(delay)
        child.kill()
        last = child.steps[-1]
        replay = (
            f"[{name} trial {trial}, kill {how}, checkpoint_threshold={threshold}, last step"
            f" reported: {last}; replay with IDEM_SEED={SEED}]"
        )

        assert child.process.exitcode == -signal.SIGKILL, f"the child was not killed {replay}"
        observed = state(db)  # opening the file replays the WAL
        if observed == old:
            outcome = "old state (kill landed before the commit)"
        elif observed == new:
            outcome = "new state (kill landed after the commit)"
        else:
            diff = {
                k: (
                    "old"
                    if v == old[scenario.table][k]
                    else "new"
                    if v == new[scenario.table][k]
                    else f"NEITHER: {v}"
                )
                for k, v in observed[scenario.table].items()
            }
            pytest.fail(
                f"After the kill the warehouse is neither the old nor the new state {replay}:"
                f" per partition {diff}; tables {observed['tables']}; views {observed['views']}"
            )
        if last in ("committed", "closed"):
            assert observed == new, f"publish() returned, yet the commit was lost {replay}"
        # No staging leftovers: no files beside the database and its WAL (a read-only open
        # replays the WAL but leaves it for the next writer to checkpoint).
        leftovers = set(os.listdir(tmp_path)) - {"batch.arrow", "expected.duckdb", "w.duckdb.wal"}
        assert leftovers == {"w.duckdb"}, f"{leftovers} {replay}"
        outcomes[outcome] += 1
        OUTCOMES[outcome] += 1
        LAST_STEP[last] += 1

        # The rerun after a crash publishes normally.
        with duckdb.connect(str(db)) as conn:
            ia.publish(
                conn,
                read_batch(str(batch_path)),
                settings(scenario.mode, scenario.metadata, table=scenario.table),
                window(*scenario.keys),
                now=NOW,
            )
        assert state(db) == new, f"the rerun after the kill did not publish the batch {replay}"
        wal = Path(f"{db}.wal")
        wal_bytes = wal.stat().st_size if wal.exists() else 0
        assert wal_bytes < 4096, f"the rerun's close left a {wal_bytes}-byte WAL {replay}"

    REPORT.append(
        f"crash {name}: {TRIALS_PER_SCENARIO} SIGKILLs (publish {commit_s * 1000:.0f} ms,"
        f" with close {close_s * 1000:.0f} ms): "
        + ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items()))
    )
