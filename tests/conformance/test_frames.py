"""Every frame library users return reaches every backend unchanged: Polars in and out.

A Polars frame crosses to Arrow without a copy and back the same way, so types that pandas
would change (a nullable integer turned float, a nanosecond-less timestamp) arrive as written.
"""

from datetime import datetime

import dagster as dg
import polars as pl
import pytest

import idem_assets as ia
from tests.conformance.conftest import Store
from tests.conformance.test_replace_contract import EVENTS, materialize
from tests.helpers import DAILY


def polars_events(day: str, version: int = 0) -> pl.DataFrame:
    """Four events of ``day``: one with no amount, as Polars keeps it (an Int64 null)."""
    start = datetime.fromisoformat(day)
    return pl.DataFrame(
        {
            "event_id": [int(start.strftime("%Y%m%d")) * 10 + i for i in range(4)],
            "event_at": [start.replace(hour=h) for h in (0, 6, 12, 23)],
            "amount": [10 + version, None, 30 + version, 40 + version],
        }
    )


def pipeline(lazy: bool) -> list[dg.AssetsDefinition]:
    """``events`` returns Polars (eager or lazy); ``totals`` reads its window as Polars."""
    frame = pl.LazyFrame if lazy else pl.DataFrame

    @dg.asset(partitions_def=DAILY, io_manager_key="io_manager", metadata=EVENTS)
    def events(context: dg.AssetExecutionContext) -> frame:  # type: ignore[valid-type]
        """Events of the day, built in Polars."""
        day = polars_events(context.partition_key)
        return day.lazy() if lazy else day

    @dg.asset(
        partitions_def=DAILY,
        io_manager_key="io_manager",
        metadata={"partition_expr": "event_at"},
    )
    def totals(events: frame) -> pl.DataFrame:  # type: ignore[valid-type]
        """The day's amount and its events without one, computed in Polars."""
        assert isinstance(events, frame), type(events)
        day = events.collect() if isinstance(events, pl.LazyFrame) else events
        # Int64 with a null: pandas would have handed over float64 with NaN.
        assert day.schema["amount"] == pl.Int64
        return day.group_by(pl.col("event_at").dt.truncate("1d")).agg(
            pl.col("amount").sum().alias("amount"),
            pl.col("amount").null_count().cast(pl.Int64).alias("missing"),
        )

    return [events, totals]


@pytest.mark.parametrize("lazy", [False, True], ids=["DataFrame", "LazyFrame"])
def test_polars_out_and_in_rerun_replaces_the_day(store: Store, lazy: bool) -> None:
    """Polars out, Polars in; a rerun replaces the day; nulls and integer types survive."""
    assets = pipeline(lazy)
    for _run in range(2):
        materialize(store, assets, "2026-01-02")
    materialize(store, assets, "2026-01-03")
    assert store.rows("events") == [
        (202601020, datetime(2026, 1, 2, 0), 10),
        (202601021, datetime(2026, 1, 2, 6), None),
        (202601022, datetime(2026, 1, 2, 12), 30),
        (202601023, datetime(2026, 1, 2, 23), 40),
        (202601030, datetime(2026, 1, 3, 0), 10),
        (202601031, datetime(2026, 1, 3, 6), None),
        (202601032, datetime(2026, 1, 3, 12), 30),
        (202601033, datetime(2026, 1, 3, 23), 40),
    ]
    assert store.rows("totals") == [
        (datetime(2026, 1, 2), 80, 1),
        (datetime(2026, 1, 3), 80, 1),
    ]


def test_polars_stray_row_is_refused_and_nothing_changes(store: Store) -> None:
    """A Polars batch gets the same guards: a row of another day is refused before any write."""
    materialize(store, pipeline(lazy=False)[:1], "2026-01-02")
    before = store.snapshot()

    @dg.asset(name="events", partitions_def=DAILY, io_manager_key="io_manager", metadata=EVENTS)
    def stray_events(context: dg.AssetExecutionContext) -> pl.DataFrame:
        """The day plus one event of the next day."""
        return pl.concat([polars_events(context.partition_key), polars_events("2026-01-03")[:1]])

    with pytest.raises(ia.StrayRowsError, match=r"1 of 5 rows have 'event_at' outside"):
        materialize(store, [stray_events], "2026-01-02")
    assert store.snapshot() == before


def test_an_audited_polars_batch_is_checked_then_published(store: Store) -> None:
    """``@audited_asset`` judges a Polars batch like any other: a failing check blocks it."""
    fill_missing = {"value": True}

    @ia.audited_asset(
        checks=[ia.not_null("amount")],
        partitions_def=DAILY,
        io_manager_key="io_manager",
        metadata=EVENTS,
    )
    def events(context: dg.AssetExecutionContext) -> pl.DataFrame:
        """Events of the day; the null amount is filled while the fix is in."""
        day = polars_events(context.partition_key)
        return day.fill_null(0) if fill_missing["value"] else day

    materialize(store, [events], "2026-01-02")
    before = store.snapshot()
    fill_missing["value"] = False
    with pytest.raises(ia.BlockingCheckError, match=r"amount_not_null: 1 failing row"):
        materialize(store, [events], "2026-01-02")
    assert store.snapshot() == before
    assert [row[2] for row in store.rows("events")] == [10, 0, 30, 40]
