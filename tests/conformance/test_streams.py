"""The replace contract in streamed form: the same cases, the batch returned as a stream.

A streamed batch (a RecordBatchReader here; the other kinds are tests/lib/test_streams.py's) is
read once into DuckDB and judged there, and the engine's write reads it back batch by batch.
Every engine must store exactly what it stores for the same rows as one Arrow table, refuse the
same batches with nothing changed, and keep the old window through a crash.
"""

from collections.abc import Iterator
from typing import Any

import dagster as dg
import pyarrow as pa
import pytest

import idem_assets as ia
from idem_assets.lib.write import streams
from tests.conformance.conftest import Store
from tests.conformance.test_replace_contract import (
    ALL_DAYS,
    EVENTS,
    EVOLVING,
    REFUSALS,
    Source,
    _drifted,
    asset,
    events,
    fill,
    materialize,
    per_day,
    window_events,
)
from tests.helpers import NOW, settings, step_failure, window

#: Rows per streamed batch: a day of 1,000 rows arrives in four.
BATCH_ROWS = 300


def streamed(table: pa.Table) -> pa.RecordBatchReader:
    """``table`` as a reader of small batches, as a source too big for memory sends it."""
    return pa.RecordBatchReader.from_batches(table.schema, table.to_batches(BATCH_ROWS))


def as_stream(source: Source) -> Any:
    """An asset body returning ``source``'s batch as a stream."""

    def run(context: dg.AssetExecutionContext) -> pa.RecordBatchReader:
        return streamed(source(context))

    return run


def fill_streamed(store: Store, io_manager: str = "io_manager", name: str = "events") -> None:
    """The three days of version 0, one run each, every batch streamed."""
    days = asset(as_stream(window_events), name=name, io_manager=io_manager)
    for day in ALL_DAYS:
        materialize(store, [days], day)


@pytest.mark.parametrize("io_manager", ["io_manager", "merge_io_manager"])
def test_a_streamed_rerun_stores_what_arrow_stores(store: Store, io_manager: str) -> None:
    """Streamed twice equals one run, and equals the same rows published as one table."""
    fill(store, io_manager, name="events_arrow")
    fill_streamed(store, io_manager)
    once = per_day(store)
    fill_streamed(store, io_manager)
    assert per_day(store) == once == per_day(store, "events_arrow")
    assert store.rows("events") == store.rows("events_arrow")
    assert len(store.rows("events")) == 3000


def test_a_streamed_range_replaces_every_day(store: Store) -> None:
    """A chunk of a backfill streamed in one run replaces each of its days."""
    fill_streamed(store)
    newer = asset(as_stream(lambda context: window_events(context, version=1)))
    result = materialize(store, [newer], first_last=(ALL_DAYS[0], ALL_DAYS[-1]))
    expected = pa.concat_tables([events(d, version=1) for d in ALL_DAYS])
    assert store.rows("events") == sorted(zip(*expected.to_pydict().values(), strict=True))
    counts = {
        e.materialization.partition: e.materialization.metadata["dagster/row_count"].value
        for e in result.get_asset_materialization_events()
    }
    assert counts == dict.fromkeys(ALL_DAYS, 1000)


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_every_streamed_refusal_leaves_the_store_byte_identical(store: Store, case: str) -> None:
    """Each unsafe batch is refused as when it arrives whole, and nothing changes."""
    source, io_manager, error = REFUSALS[case]
    fill(store, io_manager)
    before = store.snapshot()
    result = materialize(
        store,
        [asset(as_stream(source), io_manager=io_manager)],
        ALL_DAYS[1],
        raise_on_error=False,
    )
    assert not result.success
    failure = step_failure(result)
    assert error in failure
    assert "Nothing was changed. Fix:" in failure
    assert store.snapshot() == before


@pytest.mark.parametrize("stage", ["guards_passed", "deleted", "before_commit"])
def test_a_crash_inside_a_streamed_publish_leaves_the_old_window(store: Store, stage: str) -> None:
    """The write reads the staged copy inside the publish's one transaction or commit."""
    fill(store)
    before = store.snapshot()

    def crash(reached: str) -> None:
        if reached == stage:
            raise KeyboardInterrupt(reached)

    with store.open() as backend, pytest.raises(KeyboardInterrupt):
        ia.publish(
            backend,
            streamed(events(ALL_DAYS[1], version=7)),
            settings("overwrite", EVENTS, table="events"),
            window(ALL_DAYS[1]),
            now=NOW,
            on_stage=crash,
        )
    assert store.snapshot() == before


#: The stores whose write reads the staged copy back into the engine, a batch at a time; DuckDB
#: stages a stream in its table itself, and Spark's jobs read the copy as Parquet.
SENT_BACK = {"delta", "iceberg", "iceberg-postgres", "postgres"}


def test_a_streamed_publish_says_how_far_its_rows_got(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run log follows the rows: read, staged, judged, sent to the engine, committed."""
    monkeypatch.setattr(streams, "PROGRESS_SECONDS", 0.0)
    said: list[str] = []
    with store.open() as backend:
        caps = backend.capabilities
        ia.publish(
            backend,
            streamed(events(ALL_DAYS[1])),
            settings("overwrite", EVENTS, table="events"),
            window(ALL_DAYS[1]),
            now=NOW,
            progress=said.append,
        )
    read = [m.split(" ")[1] for m in said if m.startswith("Staging: ")]
    assert read == ["300", "600", "900", "1,000"], said
    judged = next(i for i, m in enumerate(said) if m.startswith("Every guard passed"))
    where = said[judged].removeprefix("Every guard passed on the staged batch of ")
    where = where.removesuffix("; writing it.")
    if caps.writes_in_commit:
        handed = said.index(f"Committing 1,000 rows of {where}: {caps.engine} writes them now.")
    else:
        handed = said.index(f"Wrote 1,000 rows of {where}; committing.")
    done = said.index(f"Committed {where}: main.events holds 1,000 rows there now.")
    sent = [i for i, m in enumerate(said) if m.startswith("Writing: ")]
    if store.name not in SENT_BACK:
        assert not sent, said
        return
    assert said[sent[-1]].startswith(f"Writing: 1,000 of 1,000 rows sent to {caps.engine} in ")
    # Where the commit writes the rows, they are sent after the write, else before it ends.
    assert all((handed < i) == caps.writes_in_commit and judged < i < done for i in sent), said


class SourceFailed(Exception):
    """The upstream system went away halfway through the day."""


def test_a_source_failing_midway_changes_nothing(store: Store) -> None:
    """A stream that breaks after some batches leaves the old window, with the source's error."""
    fill(store)
    before = store.snapshot()
    day = events(ALL_DAYS[1], version=3)

    def breaking() -> Iterator[pa.RecordBatch]:
        yield from day.to_batches(BATCH_ROWS)[:2]
        raise SourceFailed("the feed closed after 600 rows")

    with store.open() as backend, pytest.raises(SourceFailed, match="after 600 rows"):
        ia.publish(
            backend,
            breaking(),
            settings("overwrite", EVENTS, table="events"),
            window(ALL_DAYS[1]),
            now=NOW,
        )
    assert store.snapshot() == before


@pytest.mark.parametrize("io_manager", ["io_manager", "merge_io_manager"])
def test_a_streamed_new_column_is_added_with_the_publish(store: Store, io_manager: str) -> None:
    """Opted-in schema evolution holds for a streamed batch too."""
    fill(store, io_manager)
    drifted = asset(as_stream(_drifted), io_manager=io_manager, metadata=EVOLVING)
    materialize(store, [drifted], ALL_DAYS[1])
    stored = store.rows("events")
    assert len(stored) == 3000 and {len(r) for r in stored} == {4}
    tips = {day: {r[3] for r in stored if r[1].date().isoformat() == day} for day in ALL_DAYS}
    assert tips == {ALL_DAYS[0]: {None}, ALL_DAYS[1]: {1.0}, ALL_DAYS[2]: {None}}


def test_a_streamed_upsert_keeps_the_rows_it_does_not_name(store: Store) -> None:
    """An upsert (delete_missing False) streamed: updates, deduplicates, keeps the others."""
    upsert = {**EVENTS, "delete_missing": False, "dedupe_order_by": ["amount"]}
    fill(store, "merge_io_manager")
    newer = events(ALL_DAYS[1], version=50).slice(0, 10)

    def changed(context: dg.AssetExecutionContext) -> pa.Table:
        # Two keys twice, the older version losing to the newer by amount.
        return pa.concat_tables([events(ALL_DAYS[1]).slice(0, 2), newer])

    upserted = asset(as_stream(changed), io_manager="merge_io_manager", metadata=upsert)
    materialize(store, [upserted], ALL_DAYS[1])
    amounts = {r[0]: r[2] for r in store.rows("events") if r[1].date().isoformat() == ALL_DAYS[1]}

    def by_id(table: pa.Table) -> dict[int, float]:
        return dict(zip(table["event_id"].to_pylist(), table["amount"].to_pylist(), strict=True))

    assert amounts == {**by_id(events(ALL_DAYS[1])), **by_id(newer)}
    assert len(store.rows("events")) == 3000


def test_a_streamed_load_reads_what_a_load_in_memory_reads(store: Store) -> None:
    """The window's rows, columns, types and order, whether it is streamed or read whole.

    The last day is published after a column was added, so the days before lack it where each
    day's rows are kept apart (Delta's files); windows of one day and of two, a selection
    without the partition column, and a window that maps to no partition.
    """
    evolving = settings("overwrite", EVOLVING, table="events")
    tipped = events(ALL_DAYS[2]).append_column("tip", pa.array([0.5] * 1000))
    cases = [
        (window(ALL_DAYS[0]), None, False, 1000),
        (window(*ALL_DAYS[1:]), None, False, 2000),
        (window(ALL_DAYS[1]), ["tip", "amount"], False, 1000),
        (window(ALL_DAYS[2]), None, True, 0),
    ]
    with store.open() as backend:
        for day in ALL_DAYS[:2]:
            ia.publish(backend, events(day), evolving, window(day), now=NOW)
        ia.publish(backend, tipped, evolving, window(ALL_DAYS[2]), now=NOW)
        for where, columns, nothing, count in cases:
            whole: pa.Table = backend.load(evolving, where, nothing, True, columns)
            reader: pa.RecordBatchReader = backend.load(
                evolving, where, nothing, True, columns, stream=True
            )
            assert isinstance(whole, pa.Table) and isinstance(reader, pa.RecordBatchReader)
            read = reader.read_all()
            assert read.schema == whole.schema
            assert read.to_pylist() == whole.to_pylist() and whole.num_rows == count
