"""Every engine writes Dagster's table metadata as Dagster's own IO managers do, ours beside it.

``dagster/table_name`` (qualified as dagster-duckdb and dagster-deltalake write it),
``dagster/storage_kind`` (the UI's storage tag), ``dagster/column_schema`` (its Columns view),
``dagster/row_count`` and, for a partition, ``dagster/partition_row_count``.
"""

from typing import Any

import dagster as dg

from idem_assets.lib.backends.iceberg.catalog import DEFAULT_CATALOG_NAME
from tests.conformance.conftest import Store
from tests.conformance.test_replace_contract import (
    ALL_DAYS,
    asset,
    events,
    materialize,
    window_events,
)

STORAGE_KINDS = {
    "duckdb": "duckdb",
    "delta": "deltalake",
    "postgres": "postgres",
    "iceberg": "iceberg",
    "iceberg-postgres": "iceberg",
    "spark": "spark",
}


def table_name(store: Store, table: str) -> str:
    """The table as Dagster's IO manager for the engine names it."""
    database = {
        "duckdb": store.config.get("database"),
        "delta": "deltalake",
        "postgres": store.config.get("database"),
        "iceberg": DEFAULT_CATALOG_NAME,
        "iceberg-postgres": DEFAULT_CATALOG_NAME,
        "spark": "spark_catalog",
    }[store.name]
    return f"{database}.main.{table}"


COLUMNS = dg.TableSchema(
    columns=[
        dg.TableColumn(name="event_id", type="int64"),
        dg.TableColumn(name="event_at", type="timestamp[us]"),
        dg.TableColumn(name="amount", type="double"),
    ]
)


def metadata_by_day(result: dg.ExecuteInProcessResult) -> dict[str | None, dict[str, Any]]:
    """Each materialization's metadata as plain values, by partition."""
    return {
        m.partition: {k: getattr(v, "value", v) for k, v in m.metadata.items()}
        for m in (e.materialization for e in result.get_asset_materialization_events())
    }


def test_a_partitions_materialization_carries_dagsters_table_metadata(store: Store) -> None:
    result = materialize(store, [asset(window_events)], ALL_DAYS[0])
    md = metadata_by_day(result)[ALL_DAYS[0]]
    assert md["dagster/table_name"] == table_name(store, "events")
    assert md["dagster/storage_kind"] == STORAGE_KINDS[store.name]
    assert md["dagster/column_schema"] == COLUMNS
    assert md["dagster/partition_row_count"] == 1000
    assert md["dagster/row_count"] == 1000
    assert md["rows_inserted"] == 1000


def test_each_day_of_a_range_carries_its_own_partition_row_count(store: Store) -> None:
    result = materialize(store, [asset(window_events)], first_last=(ALL_DAYS[0], ALL_DAYS[1]))
    md = metadata_by_day(result)
    assert sorted(md) == ALL_DAYS[:2]
    for day in ALL_DAYS[:2]:
        assert md[day]["dagster/partition_row_count"] == 1000
        assert md[day]["dagster/storage_kind"] == STORAGE_KINDS[store.name]
        assert md[day]["dagster/table_name"] == table_name(store, "events")


def test_an_unpartitioned_table_has_a_row_count_and_no_partition_row_count(store: Store) -> None:
    whole = asset(lambda _: events(ALL_DAYS[0]), partitioned=False, metadata={})
    md = metadata_by_day(materialize(store, [whole]))[None]
    assert md["dagster/row_count"] == 1000
    assert "dagster/partition_row_count" not in md
    assert md["dagster/column_schema"] == COLUMNS
