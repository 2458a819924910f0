"""An input's metadata 'columns' loads only those columns, on every engine (dagster-duckdb's key).

The engine reads the selection itself (a SELECT list, a scan's projection); a column the table
lacks is refused with the selection that works.
"""

import dagster as dg
import pandas as pd
import pyarrow as pa
import pytest

import idem_assets as ia
from tests.conformance.conftest import Store
from tests.conformance.test_replace_contract import (
    ALL_DAYS,
    asset,
    events,
    materialize,
    window_events,
)
from tests.helpers import DAILY


def reader(columns: list[str], frame: type) -> dg.AssetsDefinition:
    """``picked`` returns what its input loaded, after checking the columns it got."""

    @dg.asset(
        partitions_def=DAILY,
        ins={"events": dg.AssetIn(metadata={"columns": columns})},
        metadata={"partition_expr": "event_at"},
    )
    def picked(events: frame) -> frame:  # type: ignore[valid-type]
        names = events.column_names if isinstance(events, pa.Table) else list(events.columns)
        assert names == columns
        return events

    return picked


@pytest.mark.parametrize("frame", [pa.Table, pd.DataFrame], ids=["arrow", "pandas"])
def test_an_input_loads_only_its_selected_columns(store: Store, frame: type) -> None:
    source = asset(window_events)
    materialize(store, [source], ALL_DAYS[0])
    materialize(store, [source, reader(["amount", "event_at"], frame)], ALL_DAYS[0])
    day = events(ALL_DAYS[0])
    expected = sorted(zip(day["amount"].to_pylist(), day["event_at"].to_pylist(), strict=True))
    assert store.rows("picked") == expected


def test_a_selected_column_the_table_lacks_is_refused_with_the_selection_that_works(
    store: Store,
) -> None:
    source = asset(window_events)
    with pytest.raises(ia.ConfigurationError) as refused:
        materialize(store, [source, reader(["event_at", "tip"], pa.Table)], ALL_DAYS[0])
    assert str(refused.value) == (
        "Refused to load asset 'events' for input 'events': metadata 'columns' names ['tip'],"
        " which table main.events does not have. Nothing was changed. Fix:"
        " metadata={'columns': ['event_at']}, or add the column(s) to the upstream asset first."
    )
    materialize(store, [source, reader(["event_at"], pa.Table)], ALL_DAYS[0])
    assert len(store.rows("picked")) == 1000
