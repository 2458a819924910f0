"""An op's output (no asset key) is stored as dagster-duckdb stores it, with every guard.

The table is the output's metadata 'table' (else its name); a partitioned run replaces only its
partitions when the output names its 'partition_expr', and is refused without one.
"""

from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import idem_assets as ia
from tests.conformance.conftest import Store
from tests.conformance.test_replace_contract import ALL_DAYS, events
from tests.helpers import DAILY

NUMBERS = pa.table({"n": pa.array([1, 2, 3], pa.int64()), "label": ["a", "b", "c"]})


@dg.op(out=dg.Out(metadata={"table": "op_numbers"}))
def numbers() -> pa.Table:
    return NUMBERS


@dg.op(out=dg.Out(metadata={"table": "op_doubled"}))
def doubled(numbers: pa.Table) -> pa.Table:
    return numbers.set_column(0, "n", pc.multiply(numbers["n"], 2))


@dg.graph
def double() -> None:
    doubled(numbers())


def test_op_outputs_replace_their_tables_and_feed_the_next_op(store: Store) -> None:
    job = double.to_job(resource_defs=store.resources())
    for _ in range(2):
        assert job.execute_in_process().success
        assert store.rows("op_numbers") == [(1, "a"), (2, "b"), (3, "c")]
        assert store.rows("op_doubled") == [(2, "a"), (4, "b"), (6, "c")]


def no_table(store: Store, table: str) -> bool:
    with store.open() as backend:
        return ia.table_fingerprint(backend, "main", table) is None


def partitioned_job(store: Store, out: dict[str, Any], version: int = 0) -> dg.JobDefinition:
    """A daily job: its day's events into op_events, then a copy of what it reads back."""

    @dg.op(out=dg.Out(metadata={"table": "op_events", **out}))
    def day_events(context: dg.OpExecutionContext) -> pa.Table:
        return events(context.partition_key, rows=10, version=version)

    @dg.op(out=dg.Out(metadata={"table": "op_copies", "partition_expr": "event_at"}))
    def copies(day_events: pa.Table) -> pa.Table:
        # Reading anything but the run's day would be refused as stray rows of the copy.
        return day_events

    @dg.job(partitions_def=DAILY, resource_defs=store.resources())
    def daily() -> None:
        copies(day_events())

    return daily


def test_a_partitioned_runs_op_output_replaces_only_its_day(store: Store) -> None:
    for version, day in [(0, ALL_DAYS[0]), (0, ALL_DAYS[1]), (1, ALL_DAYS[0])]:
        job = partitioned_job(store, {"partition_expr": "event_at"}, version)
        assert job.execute_in_process(partition_key=day).success
    expected = sorted(
        zip(
            *pa.concat_tables(
                [events(ALL_DAYS[0], rows=10, version=1), events(ALL_DAYS[1], rows=10)]
            )
            .to_pydict()
            .values(),
            strict=True,
        )
    )
    assert store.rows("op_events") == expected
    assert store.rows("op_copies") == expected


def test_an_op_output_without_partition_expr_in_a_partitioned_run_is_refused(
    store: Store,
) -> None:
    job = partitioned_job(store, {})
    with pytest.raises(ia.ConfigurationError) as refused:
        job.execute_in_process(partition_key=ALL_DAYS[0])
    message = str(refused.value)
    assert message.startswith("Refused to write op output 'day_events.result': the run is for")
    assert "Nothing was changed. Fix:" in message
    assert "dg.Out(metadata={'partition_expr': 'pickup_at'})" in message
    assert no_table(store, "op_events")
    # The printed fix, with this table's column.
    fixed = partitioned_job(store, {"partition_expr": "event_at"})
    assert fixed.execute_in_process(partition_key=ALL_DAYS[0]).success
    assert len(store.rows("op_events")) == 10


def test_an_op_outputs_rows_outside_the_runs_day_are_refused(store: Store) -> None:
    @dg.op(out=dg.Out(metadata={"table": "op_events", "partition_expr": "event_at"}))
    def day_events(context: dg.OpExecutionContext) -> pa.Table:
        return pa.concat_tables([events(ALL_DAYS[0], rows=5), events(ALL_DAYS[1], rows=2)])

    @dg.job(partitions_def=DAILY, resource_defs=store.resources())
    def daily() -> None:
        day_events()

    with pytest.raises(ia.StrayRowsError, match="2 of 7 rows have 'event_at' outside the window"):
        daily.execute_in_process(partition_key=ALL_DAYS[0])
    assert no_table(store, "op_events")


@dg.op(
    ins={"numbers": dg.In(metadata={"columns": ["label"]})},
    out=dg.Out(metadata={"table": "op_labels"}),
)
def labels(numbers: pa.Table) -> pa.Table:
    assert numbers.column_names == ["label"]
    return numbers


@dg.graph
def label() -> None:
    labels(numbers())


def test_an_op_input_loads_only_the_columns_its_in_selects(store: Store) -> None:
    assert label.to_job(resource_defs=store.resources()).execute_in_process().success
    assert store.rows("op_labels") == [("a",), ("b",), ("c",)]
