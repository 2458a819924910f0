"""Static, dynamic and multi partitions: settings, windows and their refusals, engine aside."""

from datetime import date, datetime, timedelta

import dagster as dg
import duckdb
import pandas as pd
import pyarrow as pa
import pytest

import idem_assets as ia
from idem_assets.lib.model.windows import Condition, region_for, region_of
from idem_assets.lib.sql.predicates import region_sql
from tests.helpers import DAILY, NOW, settings

REGIONS = dg.StaticPartitionsDefinition(["east", "north", "south"])
MULTI = dg.MultiPartitionsDefinition({"date": DAILY, "region": REGIONS})
BY_DIMENSION = {"date": "sold_at", "region": "region"}


def resolve(metadata: dict, partitions_def: dg.PartitionsDefinition) -> ia.WriteSettings:
    return settings("overwrite", metadata, table="sales", partitions_def=partitions_def)


def test_a_multi_asset_names_a_column_per_dimension_and_the_time_one() -> None:
    settings = resolve({"partition_expr": BY_DIMENSION}, MULTI)
    assert settings.partition_columns == (("date", "sold_at"), ("region", "region"))
    assert settings.time_column == "sold_at"
    assert settings.partition_names == ("sold_at", "region")


@pytest.mark.parametrize(
    "partition_expr",
    [{"date": "sold_at"}, {"date": "sold_at", "region": "region", "x": "x"}, "sold_at"],
)
def test_a_multi_asset_without_a_column_for_each_dimension_is_refused(
    partition_expr: object,
) -> None:
    with pytest.raises(ia.ConfigurationError) as refused:
        resolve({"partition_expr": partition_expr}, MULTI)
    message = str(refused.value)
    assert "dimensions ['date', 'region']" in message
    assert "Fix: metadata={'partition_expr': {'date': '<date column>', 'region':" in message


def test_one_column_for_two_dimensions_is_refused() -> None:
    with pytest.raises(ia.ConfigurationError, match="names one column for two dimensions"):
        resolve({"partition_expr": {"date": "sold_at", "region": "SOLD_AT"}}, MULTI)


def test_a_static_asset_has_no_time_column() -> None:
    settings = resolve({"partition_expr": "region"}, REGIONS)
    assert (settings.partition_columns, settings.time_column) == ((("", "region"),), None)


def test_a_key_the_static_definition_does_not_list_is_refused() -> None:
    with pytest.raises(ia.ConfigurationError) as refused:
        ia.window_from_keys(REGIONS, ["west"], "sales")
    assert "'west' is not a partition of its StaticPartitionsDefinition" in str(refused.value)
    assert "keys ['east', 'north', 'south']" in str(refused.value)


@pytest.mark.parametrize(
    ("key", "names"),
    [
        ("2025-12-31|north", "'2025-12-31' is not a partition of its"),
        ("2026-01-02|west", "'west' is not a partition of its StaticPartitionsDefinition"),
        ("north", "is not a key of its MultiPartitionsDefinition"),
    ],
)
def test_a_multi_key_outside_either_dimension_is_refused(key: str, names: str) -> None:
    with pytest.raises(ia.ConfigurationError, match=names):
        ia.window_from_keys(MULTI, [key], "sales")


def test_a_product_of_keys_is_one_box_and_any_other_set_a_box_per_key() -> None:
    types = {"sold_at": pa.timestamp("us"), "region": pa.string()}
    columns = (("region", "region"), ("date", "sold_at"))
    product = ia.window_from_keys(
        MULTI, [f"2026-01-0{d}|{r}" for d in (1, 2) for r in ("east", "north")], "sales"
    )
    assert region_for(product, columns, types) == (
        (
            Condition("sold_at", spans=((datetime(2026, 1, 1), datetime(2026, 1, 3)),)),
            Condition("region", values=("east", "north")),
        ),
    )
    scattered = ia.window_from_keys(MULTI, ["2026-01-01|east", "2026-01-02|north"], "sales")
    boxes = region_for(scattered, columns, types)
    assert [tuple(c.values for c in box if c.values) for box in boxes] == [
        (("east",),),
        (("north",),),
    ]
    # The scattered pair's boxes hold (day 1, east) and (day 2, north), not (day 1, north).
    with duckdb.connect() as conn:
        rows = pa.table(
            {
                "sold_at": [datetime(2026, 1, 1, 5), datetime(2026, 1, 1, 6), datetime(2026, 1, 2)],
                "region": ["east", "north", "north"],
            }
        )
        conn.register("rows", rows)
        pred, params = region_sql(boxes, "duckdb")
        kept = conn.execute(f"SELECT region, sold_at FROM rows WHERE {pred}", params).fetchall()
    assert kept == [("east", datetime(2026, 1, 1, 5)), ("north", datetime(2026, 1, 2))]


def test_a_category_key_is_compared_as_the_columns_type() -> None:
    window = ia.window_from_keys(dg.StaticPartitionsDefinition(["7", "x"]), ["7"], "sales")
    assert region_for(window, (("", "store_id"),), {"store_id": pa.int32()}) == (
        (Condition("store_id", values=(7,)),),
    )
    # "07" would name the rows of "7" too, and "x" no row at all.
    for key in ["x", "07", " 7"]:
        other = ia.window_from_keys(dg.StaticPartitionsDefinition(["7", key]), [key], "sales")
        with pytest.raises(ia.ConfigurationError, match="cannot be compared with its partition"):
            region_for(other, (("", "store_id"),), {"store_id": pa.int32()})
    minus = ia.window_from_keys(dg.StaticPartitionsDefinition(["-3"]), ["-3"], "sales")
    assert region_for(minus, (("", "store_id"),), {"store_id": pa.int32()}) == (
        (Condition("store_id", values=(-3,)),),
    )


@pytest.mark.parametrize(
    ("column", "values", "names"),
    [
        ("region", [1.5, 1.5], "partition column 'region' holds a static or dynamic"),
        ("sold_at", ["2026-01-02", "2026-01-02"], "partition column 'sold_at' is"),
    ],
)
def test_partition_columns_of_the_wrong_kind_are_refused(
    column: str, values: list, names: str
) -> None:
    frame = pd.DataFrame(
        {"sale_id": [1, 2], "sold_at": [datetime(2026, 1, 2, 1)] * 2, "region": ["east"] * 2}
    )
    frame[column] = values
    settings = resolve({"partition_expr": BY_DIMENSION}, MULTI)
    window = ia.window_from_keys(MULTI, ["2026-01-02|east"], "sales")
    with duckdb.connect() as conn:
        with pytest.raises(ia.SchemaMismatchError, match=names):
            ia.publish(conn, pa.Table.from_pandas(frame), settings, window, now=NOW)
        assert conn.execute("SELECT count(*) FROM duckdb_tables()").fetchone() == (0,)


def test_an_audited_asset_without_a_time_dimension_refuses_freshness_at_definition() -> None:
    with pytest.raises(ia.ConfigurationError) as refused:

        @ia.audited_asset(
            checks=[ia.freshness("sold_at", timedelta(hours=1))],
            partitions_def=REGIONS,
            metadata={"partition_expr": "region"},
        )
        def sales(context: dg.AssetExecutionContext) -> pd.DataFrame:
            """Sales."""
            return pd.DataFrame()

    assert str(refused.value) == (
        "@audited_asset sales: freshness() is measured against the end of a partition's time"
        " window, and its partitions have no time. Use it on a time-partitioned asset, or on"
        " one with a time dimension (a dg.MultiPartitionsDefinition with a daily dimension,"
        " say)."
    )


def test_the_window_metadata_names_each_dimension() -> None:
    dates = [date(2026, 1, 1), date(2026, 1, 2)]
    frame = pd.DataFrame(
        {
            "sale_id": [1, 2, 3, 4],
            "sold_at": [d for d in dates for _ in (0, 1)],
            "region": ["east", "north"] * 2,
        }
    )

    @dg.asset(partitions_def=MULTI, metadata={"partition_expr": BY_DIMENSION})
    def sales(context: dg.AssetExecutionContext) -> pd.DataFrame:
        """Sales of the run's cells."""
        return frame[frame.region == "east"]

    result = dg.materialize(
        [sales],
        resources={"io_manager": ia.DuckDBOverwriteIOManager(database=":memory:")},
        tags={
            "dagster/asset_partition_range_start": "2026-01-01|east",
            "dagster/asset_partition_range_end": "2026-01-02|east",
        },
    )
    by_key = {
        e.materialization.partition: e.materialization.metadata
        for e in result.get_asset_materialization_events()
    }
    metadata = by_key["2026-01-01|east"]
    assert metadata["window"].value == (
        "[2026-01-01T00:00:00+00:00, 2026-01-02T00:00:00+00:00) region=east"
    )
    assert metadata["range_window"].value == (
        "[2026-01-01T00:00:00+00:00, 2026-01-03T00:00:00+00:00) region=east"
    )


def test_a_partition_column_the_stored_table_lacks_is_named_with_the_fix() -> None:
    window = ia.window_from_keys(MULTI, ["2026-01-02|east"], "sales")
    stored = {"sold_at": pa.timestamp("us")}
    with pytest.raises(ia.SchemaMismatchError) as refused:
        region_of(window, BY_DIMENSION, stored.__getitem__, "main.sales")
    assert "table main.sales has no partition column 'region'" in str(refused.value)
    assert region_of(None, BY_DIMENSION, stored.__getitem__, "main.sales") == ()
