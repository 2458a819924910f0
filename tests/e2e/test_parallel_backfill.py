"""Backfills that write in parallel: the Postgres warehouse, a pool of 3 slots, the real daemon.

deploy/'s Postgres instance, the stock daemon and webserver and a gRPC code server run the taxi
location with IDEM_WAREHOUSE=postgres. A one-run-per-day backfill of taxi_daily, launched with
`dagster job backfill` as a user does, runs with the warehouse pool at 3 slots, then again from
an empty warehouse at 1 slot: the first keeps 3 runs in progress at once, the second one, and
every day ends with the same rows and fingerprints, and every running total is the revenue
summed up to its day. IDEM_PARALLEL_DAYS=31 (`make test-full`) runs 31 days; `make test` runs 6,
two waves of three: the slots all taken at once, then a wave that waits for them.
"""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from postgres_server import PostgresServer

from idem_assets.defs.partitions import DAILY

from .parallel_backfill import (
    Stack,
    backfill_one_run_per_day,
    day_state,
    drop_warehouse_tables,
    postgres_stack,
    stale_running_totals,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DAYS = DAILY.get_partition_keys()[: int(os.environ.get("IDEM_PARALLEL_DAYS", "6"))]
ROWS_PER_DAY = 200
SLOTS = 3


@pytest.fixture
def stack(postgres_server: PostgresServer, tmp_path: Path) -> Iterator[Stack]:
    stack = postgres_stack(postgres_server, tmp_path, "postgres", DAYS, ROWS_PER_DAY)
    stack.services.start()
    try:
        yield stack
    finally:
        stack.services.stop()
    assert stack.services.leftover_processes() == []


def test_a_backfill_writes_three_days_at_once_and_ends_as_a_serial_one(stack: Stack) -> None:
    parallel = backfill_one_run_per_day(stack, DAYS, SLOTS)

    assert {r.partition: r.status for r in parallel.records} == dict.fromkeys(DAYS, "SUCCESS")
    # The pool's 3 slots all taken at once; and runs, not only their start-up, overlapping.
    assert parallel.overlap == SLOTS
    assert parallel.overlap_started >= 2
    in_parallel = day_state(stack, DAYS)
    rows = {key: state[0] for key, state in in_parallel.items() if state is not None}
    assert len(rows) == 4 * len(DAYS)
    assert {rows[("raw_trips", day)] for day in DAYS} == {ROWS_PER_DAY}
    assert {rows[("trips", day)] for day in DAYS} == {ROWS_PER_DAY}
    assert {rows[("revenue_running_total", day)] for day in DAYS} == {1}
    assert stale_running_totals(stack) == (DAYS, [])

    drop_warehouse_tables(stack)
    serial = backfill_one_run_per_day(stack, DAYS, 1)

    assert {r.partition: r.status for r in serial.records} == dict.fromkeys(DAYS, "SUCCESS")
    assert serial.overlap == serial.overlap_steps == 1
    assert [r.partition for r in sorted(serial.records, key=lambda r: r.start_time or 0)] == DAYS
    assert day_state(stack, DAYS) == in_parallel
    assert stale_running_totals(stack) == (DAYS, [])
    print(
        f"\n{len(DAYS)} days, one run per day: {SLOTS} slots {parallel.wall_s} s,"
        f" 1 slot {serial.wall_s} s"
    )
