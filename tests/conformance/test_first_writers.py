"""The first writers of a new table: two processes materialise at once, before any table exists.

Both writers start on a store without the table (each race writes a table of its own) and are
held right before their commits until both got there (or, where the engine makes one wait for
the other, for a few seconds), so each decided that it creates the table. Whatever the engine,
the table must end as one order of the two writes leaves it, or with one of them refused
cleanly: never both batches in one day, never a key stored twice, never a batch stored under
the other's columns.
"""

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

import idem_assets as ia
from tests.conformance.conftest import Store
from tests.conformance.writers import batch, materialize_at_once
from tests.reliability.support import REPORT, count
from tests.reliability.workers import context

pytestmark = pytest.mark.slow

#: One race per case in the everyday run: without the fix every case lost its first race.
RACES = count(1, 10)
DAY, OTHER_DAY = "2026-01-02", "2026-01-03"
#: A writer: its day, its batch's version and its variant (see ``writers.batch``).
Writer = tuple[str, int, str]
#: The library's refusals: a writer refused with any other error was not refused cleanly.
REFUSALS = {c.__name__ for c in (ia.IdempotencyError, *ia.IdempotencyError.__subclasses__())}


def race(
    store: Store, table: str, mode: str, writers: Sequence[Writer], streamed: bool = False
) -> list[tuple[str, int, Any]]:
    """Start every writer of asset ``table`` at once; each one's ``(outcome, attempts, detail)``.

    ``streamed``: each returns its batch as a RecordBatchReader.
    """
    ctx = context()
    barrier = ctx.Barrier(len(writers))
    children = []
    for day, version, variant in writers:
        reader, sender = ctx.Pipe(duplex=False)
        args = (store.name, dict(store.config), dict(store.env), table, mode, day, version, variant)
        process = ctx.Process(
            target=materialize_at_once,
            args=(*args, barrier, sender),
            kwargs={"streamed": streamed},
            daemon=True,
        )
        process.start()
        sender.close()
        children.append((process, reader))
    results = []
    for process, reader in children:
        # A deadline for a hung writer: a Spark writer starts a JVM of its own first.
        assert reader.poll(300), "a writer reported nothing"
        results.append(reader.recv())
        process.join(30)
    for outcome, _, detail in results:
        assert outcome != "crashed", detail
        if outcome == "refused":
            assert detail[0] in REFUSALS, f"not a clean refusal: {detail[0]}: {detail[1]}"
    return results


def rows_of(writers: Sequence[Writer]) -> list[tuple]:
    """The rows the batches of ``writers`` hold together, sorted as a store reads them."""
    found = []
    for day, version, variant in writers:
        table = batch(day, version, variant)
        found += list(zip(*table.to_pydict().values(), strict=True))
    return sorted(found)


def committed(writers: Sequence[Writer], results: Sequence[tuple]) -> list[Writer]:
    return [w for w, r in zip(writers, results, strict=True) if r[0] == "committed"]


def summary(results: Sequence[tuple]) -> str:
    return " + ".join(sorted(f"{r[0]} after {r[1]}" for r in results))


@pytest.mark.parametrize(
    ("mode", "second", "streamed"),
    [
        ("overwrite", (DAY, 2, "plain"), False),
        ("merge", (DAY, 2, "fewer"), False),
        ("overwrite", (DAY, 2, "plain"), True),
    ],
    ids=["overwrite", "merge", "overwrite-streamed"],
)
def test_first_writers_of_one_day_leave_one_batch(
    store: Store, mode: str, second: Writer, streamed: bool
) -> None:
    """One day, two batches (the merge's second lacks a tenth of the keys): one of them, whole.

    Streamed, each batch is staged first and the engine writes it from the staged copy (Delta
    Lake hands it to delta-rs a bounded amount at a time, through the creating commit too).
    """
    writers = [(DAY, 1, "plain"), second]
    seen: Counter[str] = Counter()
    for i in range(RACES):
        results = race(store, f"events_{i}", mode, writers, streamed)
        stored = store.rows(f"events_{i}")
        assert stored in (rows_of(writers[:1]), rows_of(writers[1:])), summary(results)
        assert committed(writers, results), results
        seen[summary(results)] += 1
    form = f"{mode}, streamed" if streamed else mode
    REPORT.append(f"first writers, one day, {form}, {store.name}: {RACES} races: {dict(seen)}")


@pytest.mark.parametrize(
    ("mode", "variant"),
    [("overwrite", "plain"), ("merge", "shared")],
    ids=["overwrite", "merge-shared-keys"],
)
def test_first_writers_of_two_days_each_commit_whole_or_are_refused(
    store: Store, mode: str, variant: str
) -> None:
    """Two days: both commit, or one is refused; with keys both days hold, never both."""
    writers = [(DAY, 1, variant), (OTHER_DAY, 2, variant)]
    seen: Counter[str] = Counter()
    for i in range(RACES):
        results = race(store, f"events_{i}", mode, writers)
        stored = store.rows(f"events_{i}")
        winners = committed(writers, results)
        assert winners, results
        assert stored == rows_of(winners), summary(results)
        keys = Counter(row[0] for row in stored)
        assert max(keys.values()) == 1, f"keys stored twice: {summary(results)}"
        seen[summary(results)] += 1
    REPORT.append(f"first writers, two days, {mode} {variant}, {store.name}: {dict(seen)}")


@pytest.mark.parametrize("mode", ["overwrite", "merge"])
def test_first_writers_with_different_columns_never_store_one_under_the_others(
    store: Store, mode: str
) -> None:
    """One batch has an extra column: the other is refused, never stored with it as NULL."""
    writers = [(DAY, 1, "tip"), (OTHER_DAY, 2, "plain")]
    seen: Counter[str] = Counter()
    for i in range(RACES):
        results = race(store, f"events_{i}", mode, writers)
        winners = committed(writers, results)
        assert len(winners) == 1, summary(results)
        assert store.rows(f"events_{i}") == rows_of(winners), summary(results)
        refused = next(r for r in results if r[0] == "refused")
        assert refused[2][0] in ("SchemaMismatchError", "ConcurrentWriteError"), refused
        seen[summary(results)] += 1
    REPORT.append(f"first writers, other columns, {mode}, {store.name}: {dict(seen)}")
