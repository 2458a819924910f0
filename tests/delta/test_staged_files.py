"""A streamed overwrite of a day is staged as the table's own data file and committed as it is."""

import json
import multiprocessing.connection
import random
import shutil
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

import idem_assets as ia
from idem_assets.lib.backends.delta.backend import DeltaBackend
from tests.conformance.race_workers import publish_at_barrier
from tests.delta.kill_worker import publish_until_killed
from tests.helpers import NOW, settings, window
from tests.reliability.support import REPORT, SEED, count
from tests.reliability.workers import Child, context, write_batch

TRIPS: dict[str, Any] = {"partition_expr": "pickup_at"}
FIRST, SECOND, THIRD = "2026-01-01", "2026-01-02", "2026-01-03"
#: Held at the barrier, a commit that adds its file beside the other's breaks the first race.
RACES = count(2, 10)
WAIT_S = 120.0


def trips(day: str, ids: range, tz: str | None = None, apart: float = 60) -> pa.Table:
    """Trips ``ids`` picked up ``apart`` seconds and a few microseconds apart on ``day``."""
    start = datetime.fromisoformat(day).replace(tzinfo=UTC if tz else None)
    times = [start + timedelta(seconds=apart * i, microseconds=7 * i + 1) for i in range(len(ids))]
    return pa.table(
        {
            "trip_id": pa.array(list(ids), pa.int64()),
            "pickup_at": pa.array(times, pa.timestamp("us", tz)),
            "zone": pa.array([f"z{i % 5}" for i in ids]),
            "fare": pa.array([i / 4 for i in ids]),
        }
    )


def publish(root: Path, batch: pa.Table | pa.RecordBatchReader, day: str) -> ia.PublishResult:
    with DeltaBackend(str(root)) as backend:
        return ia.publish(backend, batch, settings("overwrite", TRIPS), window(day), now=NOW)


def day_files(root: Path, day: str) -> list[dict[str, Any]]:
    """The add actions of ``day`` in the table's latest version."""
    table = DeltaTable(str(root / "main" / "trips"))
    actions = pa.table(table.get_add_actions(flatten=False)).to_pylist()  # type: ignore[arg-type]
    return [a for a in actions if a["path"].startswith(f"idem-day={day}/")]


def rows(root: Path, day: str | None = None) -> list[tuple]:
    found = DeltaTable(str(root / "main" / "trips")).to_pyarrow_table()
    if day is not None:
        found = found.filter(
            pc.equal(found["idem-day"], pa.scalar(datetime.fromisoformat(day).date()))
        )
    return sorted(zip(*found.drop_columns(["idem-day"]).to_pydict().values(), strict=True))


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` and its bytes; every folder as an empty entry."""
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else b""
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.parametrize("tz", [None, "UTC"], ids=["naive", "aware"])
def test_a_streamed_day_is_committed_as_the_file_it_was_staged_in(
    tmp_path: Path, tz: str | None
) -> None:
    """The rerun of a day: one commit adds the staged file and removes the day's old files."""
    publish(tmp_path, trips(FIRST, range(0, 50), tz), FIRST)
    publish(tmp_path, trips(SECOND, range(100, 200), tz), SECOND)
    again = trips(SECOND, range(300, 360), tz)
    messages: list[str] = []
    with DeltaBackend(str(tmp_path)) as backend:
        result = ia.publish(
            backend,
            pa.RecordBatchReader.from_batches(again.schema, again.to_batches(max_chunksize=16)),
            settings("overwrite", TRIPS),
            window(SECOND),
            now=NOW,
            progress=messages.append,
        )
    assert result.rows == 60
    assert any("as a data file of the Delta table" in m for m in messages), messages
    [added] = day_files(tmp_path, SECOND)
    assert added["path"].startswith(f"idem-day={SECOND}/part-idem-"), added
    assert added["partition"] == {"idem-day": datetime.fromisoformat(SECOND).date()}
    assert added["num_records"] == 60
    assert added["min"]["trip_id"] == 300 and added["max"]["trip_id"] == 359
    assert added["null_count"]["zone"] == 0
    # Timestamps to the millisecond, as delta-rs records them (readers widen the maximum).
    first_time = again["pickup_at"][0].as_py()
    assert added["min"]["pickup_at"] == first_time.replace(
        microsecond=first_time.microsecond // 1000 * 1000
    )
    assert rows(tmp_path, SECOND) == sorted(zip(*again.to_pydict().values(), strict=True))
    assert len(rows(tmp_path, FIRST)) == 50
    assert not list(tmp_path.rglob("idem-staged-*"))
    # Readers that skip files by the statistics find every row of a range inside the day.
    dataset = DeltaTable(str(tmp_path / "main" / "trips")).to_pyarrow_dataset()
    last = again["pickup_at"][59].as_py()
    found = dataset.to_table(
        filter=(pc.field("pickup_at") >= first_time) & (pc.field("pickup_at") <= last)
    )
    assert found.num_rows == 60
    # And by every other column: a missing extreme would make Arrow skip the whole file.
    by_zone = dataset.to_table(filter=pc.field("zone") == "z0").column("trip_id").to_pylist()
    assert sorted(by_zone) == [i for i in [*range(0, 50), *range(300, 360)] if i % 5 == 0]
    assert dataset.to_table(filter=pc.field("fare") >= 75).num_rows == 60
    history = DeltaTable(str(tmp_path / "main" / "trips")).history(1)[0]
    assert history["operation"] == "WRITE" and history["operationParameters"]["mode"] == "Overwrite"


def test_a_committed_file_stays_when_the_next_commit_replaces_it(tmp_path: Path) -> None:
    """Another run replaces the day between this commit and its clean-up: the file stays.

    The version this publish committed must stay readable (time travel, a reader still on
    it) until VACUUM: only a file no commit added is the publish's to remove.
    """
    publish(tmp_path, trips(FIRST, range(0, 10)), FIRST)
    rerun = trips(SECOND, range(50, 55))

    def replace_at_commit(message: str) -> None:
        if message.startswith("Committed"):
            publish(tmp_path, rerun, SECOND)

    with DeltaBackend(str(tmp_path)) as backend:
        result = ia.publish(
            backend,
            trips(SECOND, range(10, 20)).to_reader(),
            settings("overwrite", TRIPS),
            window(SECOND),
            now=NOW,
            progress=replace_at_commit,
        )
    version = result.committed["delta_version"]
    at_commit = DeltaTable(str(tmp_path / "main" / "trips"), version=version).to_pyarrow_table()
    assert sorted(at_commit["trip_id"].to_pylist()) == [*range(0, 10), *range(10, 20)]
    assert rows(tmp_path, SECOND) == sorted(zip(*rerun.to_pydict().values(), strict=True))


def test_a_day_without_exact_extremes_is_added_without_statistics(tmp_path: Path) -> None:
    """A NaN has no place in Delta's extremes: the file goes in without any, read whole."""
    publish(tmp_path, trips(FIRST, range(0, 10)), FIRST)
    batch = trips(SECOND, range(10, 20))
    fares = pa.array([float("nan"), *[float(i) for i in range(11, 20)]])
    batch = batch.set_column(3, "fare", fares)
    publish(tmp_path, batch.to_reader(), SECOND)
    [added] = day_files(tmp_path, SECOND)
    assert "part-idem-" in added["path"] and added["num_records"] is None, added
    dataset = DeltaTable(str(tmp_path / "main" / "trips")).to_pyarrow_dataset()
    assert dataset.to_table(filter=pc.field("fare") > 15).num_rows == 4
    assert dataset.to_table(filter=pc.field("zone") == "z1").num_rows == 2 + 2


def test_a_stream_of_two_days_is_written_by_delta_rs(tmp_path: Path) -> None:
    """A file of two days cannot be one day's: delta-rs writes the rows, the file goes."""
    publish(tmp_path, trips(FIRST, range(0, 10)), FIRST)
    both = pa.concat_tables([trips(SECOND, range(10, 20)), trips(THIRD, range(20, 30))])
    with DeltaBackend(str(tmp_path)) as backend:
        ia.publish(
            backend, both.to_reader(), settings("overwrite", TRIPS), window(SECOND, THIRD), now=NOW
        )
    assert rows(tmp_path) == sorted(
        zip(*pa.concat_tables([trips(FIRST, range(0, 10)), both]).to_pydict().values(), strict=True)
    )
    assert not [a for a in day_files(tmp_path, SECOND) if "part-idem-" in a["path"]]
    assert not list(tmp_path.rglob("idem-staged-*")) and not list(tmp_path.rglob("part-idem-*"))


@pytest.mark.parametrize("day", [FIRST, SECOND], ids=["day-with-files", "new-day"])
def test_a_refused_streamed_day_leaves_the_lake_byte_identical(tmp_path: Path, day: str) -> None:
    """Rows of ``day`` published as THIRD's are refused: the staged file and its folder go."""
    publish(tmp_path, trips(FIRST, range(0, 10)), FIRST)
    before = tree(tmp_path)
    with pytest.raises(ia.IdempotencyError), DeltaBackend(str(tmp_path)) as backend:
        ia.publish(
            backend,
            trips(day, range(50, 60)).to_reader(),
            settings("overwrite", TRIPS),
            window(THIRD),
            now=NOW,
        )
    assert tree(tmp_path) == before


def unnamed(root: Path) -> list[str]:
    """Files the writers staged that no version of the log names (a later one may remove it)."""
    log = "".join(p.read_text() for p in root.rglob("_delta_log/*.json"))
    staged = [*root.rglob("part-idem-*"), *root.rglob("idem-staged-*")]
    return [p.name for p in staged if p.name not in log]


def race(root: Path, batches: dict[str, pa.Table]) -> list[tuple[str, Any, str]]:
    """Publish each batch streamed in its own process, all held before commit; their outcomes."""
    ctx = context()
    barrier = ctx.Barrier(len(batches))
    readers = []
    for name, batch in batches.items():
        path = root.parent / f"{root.name}-{name}.arrow"
        write_batch(str(path), batch)
        day = batch["pickup_at"][0].as_py().date().isoformat()
        reader, writer = ctx.Pipe(duplex=False)
        args = (partial(DeltaBackend, str(root)), str(path), "overwrite", TRIPS, "trips", [day])
        process = ctx.Process(
            target=publish_at_barrier, args=(*args, barrier, writer, True), daemon=True
        )
        process.start()
        writer.close()
        readers.append(reader)
    outcomes = []
    while readers:
        ready = multiprocessing.connection.wait(readers, WAIT_S)
        assert ready, f"the writers stopped reporting: {outcomes}"
        for reader in ready:
            message = reader.recv() if reader.poll() else ("error", "EOFError", "")
            if message[0] == "held":
                continue
            outcomes.append(message)
            readers.remove(reader)
            if message[0] == "error":
                barrier.abort()
    return outcomes


def test_streamed_writers_of_a_new_day_leave_one_batch(tmp_path: Path) -> None:
    """Both stage a file of the day the table lacks, both pass the guards: one batch stays.

    delta-rs records such a commit without a predicate, so its own retry would add the
    second file beside the first: the day would hold both batches.
    """
    first, second = trips(SECOND, range(100, 130)), trips(SECOND, range(200, 240))
    seen: Counter[str] = Counter()
    for i in range(RACES):
        root = tmp_path / f"lake{i}"
        publish(root, trips(FIRST, range(0, 10)), FIRST)
        outcomes = race(root, {"a": first, "b": second})
        assert [o for o in outcomes if o[0] == "committed"], outcomes
        for outcome in outcomes:
            assert outcome[0] == "committed" or outcome[1] == "ConcurrentWriteError", outcome
        stored = rows(root, SECOND)
        assert stored in (
            sorted(zip(*first.to_pydict().values(), strict=True)),
            sorted(zip(*second.to_pydict().values(), strict=True)),
        ), f"{len(stored)} rows: {outcomes}"
        [added] = day_files(root, SECOND)
        assert "part-idem-" in added["path"]
        assert not unnamed(root), "a file no commit added stayed behind"
        # Every version stays readable: a file one commit added and the next removed is kept.
        latest = DeltaTable(str(root / "main" / "trips")).version()
        for version in range(latest + 1):
            DeltaTable(str(root / "main" / "trips"), version=version).to_pyarrow_table()
        seen[" + ".join(sorted(o[0] for o in outcomes))] += 1
    REPORT.append(f"staged Delta files, writers of a new day: {RACES} races: {dict(seen)}")


def test_streamed_writers_of_two_days_both_commit(tmp_path: Path) -> None:
    """Writers of different days each add their file: the later one commits on top."""
    second, third = trips(SECOND, range(100, 130)), trips(THIRD, range(200, 240))
    for i in range(RACES):
        root = tmp_path / f"lake{i}"
        publish(root, trips(FIRST, range(0, 10)), FIRST)
        outcomes = race(root, {"a": second, "b": third})
        assert [o[0] for o in outcomes] == ["committed", "committed"], outcomes
        assert len(rows(root)) == 10 + 30 + 40
        assert len(day_files(root, SECOND)) == len(day_files(root, THIRD)) == 1
    history = DeltaTable(str(tmp_path / "lake0" / "main" / "trips")).history()
    assert json.dumps(history[0]["operationParameters"]).count("Overwrite") == 1


#: Kills per kind of day; make test-full kills more.
KILLS = count(5, 30)


def start_killable(root: Path, batch_path: Path, day: str) -> Child:
    ctx = context()
    reader, writer = ctx.Pipe(duplex=False)
    process = ctx.Process(
        target=publish_until_killed, args=(str(root), str(batch_path), day, writer), daemon=True
    )
    process.start()
    writer.close()
    child = Child(process, reader)
    assert child.wait_for("start", 60), f"the child never started: {child.steps}"
    return child


@pytest.mark.parametrize("day", [SECOND, THIRD], ids=["day-with-files", "new-day"])
def test_a_publish_killed_at_random_points_leaves_the_day_old_or_new(
    tmp_path: Path, day: str
) -> None:
    """SIGKILL while the file is written, judged or committed: the day is its old or new rows.

    Every version stays readable, a rerun publishes normally, and a full vacuum removes the
    file a killed publish left outside the log (docs/delta.md).
    """
    template = tmp_path / "template"
    publish(template, trips(FIRST, range(0, 100)), FIRST)
    publish(template, trips(SECOND, range(100, 1100)), SECOND)
    old = {d: rows(template, d) for d in (FIRST, SECOND, THIRD)}
    batch = trips(day, range(5000, 305_000), apart=0.25)
    batch_path = tmp_path / "batch.arrow"
    write_batch(str(batch_path), batch)
    new = sorted(zip(*batch.to_pydict().values(), strict=True))
    root = tmp_path / "lake"

    # Calibrate: how long the publish takes here, and the steps it reports.
    shutil.copytree(template, root)
    child = start_killable(root, batch_path, day)
    began = time.monotonic()
    assert child.wait_for("returned", 120), child.steps
    publish_s = time.monotonic() - began
    child.kill()
    points = [s for s in child.steps if s not in ("start", "returned")]
    assert {"staged", "guards_passed", "before_commit"} <= set(points), points
    assert rows(root, day) == new

    rng = random.Random(f"{SEED}/delta-staged/{day}")
    seen: Counter[str] = Counter()
    for trial in range(KILLS):
        shutil.rmtree(root)
        shutil.copytree(template, root)
        child = start_killable(root, batch_path, day)
        if rng.random() < 0.5:
            delay = rng.uniform(0, 1.1) * publish_s
            how = f"{delay * 1000:.0f} ms after start"
            child.wait_for(None, delay)
        else:
            point = rng.choice(points)
            delay = rng.uniform(0, 0.2) * publish_s
            how = f"{delay * 1000:.0f} ms after {point}"
            assert child.wait_for(point, 120), f"never reached {point}: {child.steps}"
            time.sleep(delay)
        child.kill()
        replay = f"[trial {trial}, kill {how}, last step {child.steps[-1]}, IDEM_SEED={SEED}]"
        stored = rows(root, day)
        assert stored in (old[day], new), f"{len(stored)} rows of {day} {replay}"
        if "returned" in child.steps or "committed" in child.steps:
            assert stored == new, f"the commit was lost {replay}"
        others = [d for d in (FIRST, SECOND, THIRD) if d != day]
        assert {d: rows(root, d) for d in others} == {d: old[d] for d in others}, replay
        table = DeltaTable(str(root / "main" / "trips"))
        for version in range(table.version() + 1):
            DeltaTable(str(root / "main" / "trips"), version=version).to_pyarrow_table()
        seen["new" if stored == new and stored != old[day] else "old"] += 1

        # What the kill left outside the log goes with a full vacuum (here past no retention).
        table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False, full=True)
        assert not unnamed(root), f"a file no version names survived the vacuum {replay}"
        publish(root, batch.to_reader(max_chunksize=10_000), day)
        assert rows(root, day) == new and len(day_files(root, day)) == 1, replay
    REPORT.append(f"staged Delta files, {KILLS} kills of a {day} publish: {dict(seen)}")
