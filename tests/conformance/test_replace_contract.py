"""The replace contract: what every backend must do, checked the same way on each of them.

A window is replaced whole or not at all; a rerun equals one run; a batch that would lose or
misplace rows is refused before anything changes. The failures other tools are known for are
replayed here as tests every backend must pass.
"""

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import dagster as dg
import pyarrow as pa
import pytest

import idem_assets as ia
from idem_assets.worked_example import DAYS, day_batch
from tests.conformance.conftest import Store
from tests.helpers import DAILY, NOW, range_tags, settings, step_failure, window

EVENTS: dict[str, Any] = {"partition_expr": "event_at", "primary_key": ["event_id"]}
ALL_DAYS = [d.isoformat() for d in DAYS]
Source = Callable[[dg.AssetExecutionContext], pa.Table]


def events(day: str, rows: int = 1000, version: int = 0) -> pa.Table:
    """``rows`` events inside ``day``; ids unique across days, amounts shifted by ``version``."""
    start = datetime.fromisoformat(day)
    base = int(start.strftime("%Y%m%d")) * 10_000
    return pa.table(
        {
            "event_id": pa.array([base + i for i in range(rows)], pa.int64()),
            "event_at": pa.array(
                [start + timedelta(seconds=80 * i) for i in range(rows)], pa.timestamp("us")
            ),
            "amount": pa.array([float(i % 97 + version) for i in range(rows)]),
        }
    )


def window_events(context: dg.AssetExecutionContext, version: int = 0) -> pa.Table:
    """The run's window of events: one day, or every day of a range."""
    tw = context.partition_time_window
    days, day = [], tw.start.replace(tzinfo=None)
    while day < tw.end.replace(tzinfo=None):
        days.append(events(day.date().isoformat(), version=version))
        day += timedelta(days=1)
    return pa.concat_tables(days)


def asset(
    source: Source,
    name: str = "events",
    io_manager: str = "io_manager",
    metadata: dict[str, Any] | None = None,
    partitioned: bool = True,
) -> dg.AssetsDefinition:
    """An asset whose batch is whatever ``source`` returns for the run."""

    # Not annotated pa.Table: a source may return a stream (tests/conformance/test_streams.py).
    def compute(context: dg.AssetExecutionContext) -> Any:
        return source(context)

    return dg.asset(
        name=name,
        partitions_def=DAILY if partitioned else None,
        io_manager_key=io_manager,
        metadata=dict(EVENTS if metadata is None else metadata),
    )(compute)


def materialize(
    store: Store,
    assets: Sequence[dg.AssetsDefinition],
    partition: str | None = None,
    *,
    first_last: tuple[str, str] | None = None,
    raise_on_error: bool = True,
) -> dg.ExecuteInProcessResult:
    """One run: one partition, a range of partitions, or an unpartitioned asset."""
    tags = {}
    if first_last:
        tags = range_tags(first_last[0], first_last[1])
    return dg.materialize(
        list(assets),
        resources=store.resources(),
        partition_key=partition,
        tags=tags,
        raise_on_error=raise_on_error,
    )


def per_day(store: Store, table: str = "events") -> dict[str, str | None]:
    """Each day's fingerprint of ``main.<table>``."""
    with store.open() as backend:
        return {
            d: ia.table_fingerprint(backend, "main", table, "event_at", window(d)) for d in ALL_DAYS
        }


def fill(store: Store, io_manager: str = "io_manager", name: str = "events") -> None:
    """Materialize the three days of version 0, one run each."""
    events_asset = asset(window_events, name=name, io_manager=io_manager)
    for day in ALL_DAYS:
        materialize(store, [events_asset], day)


@pytest.mark.parametrize("mode", ["overwrite", "merge"])
def test_worked_example_three_days_twice_stay_3000_rows(store: Store, mode: str) -> None:
    """The reference's figures: 3 days x 1,000 rows, run twice, stay at 3,000 rows."""
    after_run: list[int] = []
    for _run in range(2):
        with store.open() as backend:
            for day in DAYS:
                write = settings(mode, EVENTS, table="events")
                ia.publish(backend, day_batch(day), write, window(day.isoformat()), now=NOW)
        after_run.append(len(store.rows("events")))
    assert after_run == [3000, 3000]


def test_databricks_merge_example_updates_one_row_and_adds_one(store: Store) -> None:
    """Target ids 1,2,3 (id 2 at 88,000); batch id 2 at 95,000 and new id 4: four rows."""
    staff = {"primary_key": ["id"], "delete_missing": False}
    batches = {
        "first": pa.table({"id": [1, 2, 3], "salary": [70_000, 88_000, 61_000]}),
        "second": pa.table({"id": [2, 4], "salary": [95_000, 52_000]}),
    }
    current = {"batch": "first"}

    def source(context: dg.AssetExecutionContext) -> pa.Table:
        return batches[current["batch"]]

    employees = asset(source, "employees", "merge_io_manager", staff, partitioned=False)
    materialize(store, [employees])
    current["batch"] = "second"
    materialize(store, [employees])
    expected = [(1, 70_000), (2, 95_000), (3, 61_000), (4, 52_000)]
    assert store.rows("employees") == expected
    before = store.snapshot()
    materialize(store, [employees])
    assert store.rows("employees") == expected
    assert store.snapshot() == before


@pytest.mark.parametrize("io_manager", ["io_manager", "merge_io_manager"])
def test_rerun_equals_one_run_and_never_doubles_rows(store: Store, io_manager: str) -> None:
    """dagster-io/dagster#21278: a rerun of a partition must not add its rows again."""
    fill(store, io_manager)
    once = store.snapshot()
    fill(store, io_manager)
    assert store.snapshot() == once
    assert len(store.rows("events")) == 3000


def test_range_in_one_run_equals_day_by_day(store: Store) -> None:
    """A chunk of a backfill stores exactly what its days stored one run at a time."""
    fill(store, name="events_daily")
    ranged = asset(window_events, name="events_ranged")
    result = materialize(store, [ranged], first_last=(ALL_DAYS[0], ALL_DAYS[-1]))
    assert store.rows("events_ranged") == store.rows("events_daily")
    assert per_day(store, "events_ranged") == per_day(store, "events_daily")
    counts = {
        e.materialization.partition: e.materialization.metadata["dagster/row_count"].value
        for e in result.get_asset_materialization_events()
    }
    assert counts == dict.fromkeys(ALL_DAYS, 1000)


def test_range_rerun_replaces_every_day_not_only_its_first(store: Store) -> None:
    """A range run's predicate must cover all its days, not the first day's window only."""
    fill(store)
    newer = asset(lambda context: window_events(context, version=1))
    materialize(store, [newer], first_last=(ALL_DAYS[0], ALL_DAYS[-1]))
    expected = pa.concat_tables([events(d, version=1) for d in ALL_DAYS])
    assert store.rows("events") == sorted(zip(*expected.to_pydict().values(), strict=True))


def test_one_partition_never_becomes_a_whole_table_overwrite(store: Store) -> None:
    """dagster-io/dagster#34064: replacing one day must leave every other day as it was."""
    fill(store)
    before = per_day(store)
    newer = asset(lambda context: window_events(context, version=5))
    materialize(store, [newer], ALL_DAYS[1])
    after = per_day(store)
    assert after[ALL_DAYS[0]] == before[ALL_DAYS[0]]
    assert after[ALL_DAYS[2]] == before[ALL_DAYS[2]]
    assert after[ALL_DAYS[1]] != before[ALL_DAYS[1]]
    assert len(store.rows("events")) == 3000


@pytest.mark.parametrize("stage", ["guards_passed", "deleted", "inserted", "before_commit"])
@pytest.mark.parametrize("mode", ["overwrite", "merge"])
def test_crash_inside_the_publish_leaves_the_old_window(
    store: Store, mode: str, stage: str
) -> None:
    """dagster-io/dagster#14091: a crash between DELETE and INSERT must not empty the day."""
    fill(store)
    before = store.snapshot()

    def crash(reached: str) -> None:
        if reached == stage:
            raise KeyboardInterrupt(reached)

    with store.open() as backend, pytest.raises(KeyboardInterrupt):
        ia.publish(
            backend,
            events(ALL_DAYS[1], version=7),
            settings(mode, EVENTS, table="events"),
            window(ALL_DAYS[1]),
            now=NOW,
            on_stage=crash,
        )
    assert store.snapshot() == before


def _stray(context: dg.AssetExecutionContext) -> pa.Table:
    return pa.concat_tables([window_events(context), events(ALL_DAYS[2], rows=1)])


def _null_key(context: dg.AssetExecutionContext) -> pa.Table:
    batch = window_events(context)
    ids = batch.column("event_id").to_pylist()
    return batch.set_column(0, "event_id", pa.array([None, *ids[1:]], pa.int64()))


def _null_partition(context: dg.AssetExecutionContext) -> pa.Table:
    batch = window_events(context)
    stamps = batch.column("event_at").to_pylist()
    return batch.set_column(1, "event_at", pa.array([None, *stamps[1:]], pa.timestamp("us")))


def _duplicate_key(context: dg.AssetExecutionContext) -> pa.Table:
    batch = window_events(context)
    return pa.concat_tables([batch, batch.slice(0, 3)])


def _empty(context: dg.AssetExecutionContext) -> pa.Table:
    return window_events(context).slice(0, 0)


def _key_of_another_day(context: dg.AssetExecutionContext) -> pa.Table:
    batch = window_events(context)
    ids = batch.column("event_id").to_pylist()
    moved = int(datetime.fromisoformat(ALL_DAYS[0]).strftime("%Y%m%d")) * 10_000
    return batch.set_column(0, "event_id", pa.array([moved, *ids[1:]], pa.int64()))


def _drifted(context: dg.AssetExecutionContext) -> pa.Table:
    batch = window_events(context)
    return batch.append_column("tip", pa.array([1.0] * batch.num_rows))


def _missing_a_day(context: dg.AssetExecutionContext) -> pa.Table:
    return pa.concat_tables([events(ALL_DAYS[0]), events(ALL_DAYS[2])])


REFUSALS = {
    "stray rows": (_stray, "io_manager", "StrayRowsError"),
    "NULL key": (_null_key, "io_manager", "NullValueError"),
    "NULL partition value": (_null_partition, "io_manager", "NullValueError"),
    "duplicate keys": (_duplicate_key, "merge_io_manager", "DuplicateKeyError"),
    "empty batch over a filled day": (_empty, "io_manager", "EmptyBatchError"),
    "key living in another partition": (
        _key_of_another_day,
        "merge_io_manager",
        "KeyOutsideWindowError",
    ),
    "drifted schema": (_drifted, "io_manager", "SchemaMismatchError"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_every_refusal_leaves_the_store_byte_identical(store: Store, case: str) -> None:
    """Each unsafe batch is refused with the contract's message, and nothing changes."""
    source, io_manager, error = REFUSALS[case]
    fill(store, io_manager)
    before = store.snapshot()
    result = materialize(
        store, [asset(source, io_manager=io_manager)], ALL_DAYS[1], raise_on_error=False
    )
    assert not result.success
    failure = step_failure(result)
    assert error in failure
    assert "Nothing was changed. Fix:" in failure
    assert store.snapshot() == before


def test_a_range_missing_a_day_is_refused_and_changes_nothing(store: Store) -> None:
    """A chunk whose input lost a day must not erase that day."""
    fill(store)
    before = store.snapshot()
    result = materialize(
        store,
        [asset(_missing_a_day)],
        first_last=(ALL_DAYS[0], ALL_DAYS[-1]),
        raise_on_error=False,
    )
    assert not result.success
    failure = step_failure(result)
    assert "EmptyBatchError" in failure
    assert f"no rows for partition(s) ['{ALL_DAYS[1]}']" in failure
    assert store.snapshot() == before


EVOLVING: dict[str, Any] = {**EVENTS, "schema_evolution": "add_columns"}


@pytest.mark.parametrize("io_manager", ["io_manager", "merge_io_manager"])
def test_an_opted_in_new_column_is_added_with_the_publish(store: Store, io_manager: str) -> None:
    """dagster-io/dagster#13098: a new column, opted into, needs no manual migration."""
    fill(store, io_manager)

    drifted = asset(_drifted, io_manager=io_manager, metadata=EVOLVING)
    materialize(store, [drifted], ALL_DAYS[1])
    after = store.snapshot()
    materialize(store, [drifted], ALL_DAYS[1])

    stored = store.rows("events")
    assert len(stored) == 3000 and {len(r) for r in stored} == {4}
    tips = {day: {r[3] for r in stored if r[1].date().isoformat() == day} for day in ALL_DAYS}
    assert tips == {ALL_DAYS[0]: {None}, ALL_DAYS[1]: {1.0}, ALL_DAYS[2]: {None}}
    assert store.snapshot() == after


def test_a_crash_after_the_schema_change_leaves_the_old_columns(store: Store) -> None:
    """The ALTER is part of the publish's transaction: a crash after it rolls it back too."""
    fill(store)
    before = store.snapshot()
    batch = events(ALL_DAYS[1]).append_column("tip", pa.array([1.0] * 1000))

    def crash(reached: str) -> None:
        if reached == "deleted":
            raise KeyboardInterrupt(reached)

    with store.open() as backend, pytest.raises(KeyboardInterrupt):
        ia.publish(
            backend,
            batch,
            settings("overwrite", EVOLVING, table="events"),
            window(ALL_DAYS[1]),
            now=NOW,
            on_stage=crash,
        )
    assert store.snapshot() == before
    assert {len(r) for r in store.rows("events")} == {3}
