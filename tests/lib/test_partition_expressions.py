"""A SQL expression as partition_expr (dagster-duckdb's "CAST(time as DATE)") is refused before
anything is written, and the migration it prints (the column to add, the metadata to set) works
as printed: rerunning the migrated asset replaces its partition."""

import ast
import re
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import pandas as pd
import pytest

import idem_assets as ia
from tests.helpers import DAILY

REGIONS = dg.StaticPartitionsDefinition(["red", "blue"])
MULTI = dg.MultiPartitionsDefinition({"time": DAILY, "color": REGIONS})


def frame(context: dg.AssetExecutionContext) -> pd.DataFrame:
    """Three rows whose 'key' is the day as text, as dagster-duckdb's own tests write it."""
    key = context.partition_key
    day = key.keys_by_dimension["time"] if isinstance(key, dg.MultiPartitionKey) else key
    return pd.DataFrame({"key": [day] * 3, "color": ["red"] * 3, "a": [1, 2, 3]})


def asset(metadata: dict[str, Any], partitions_def: dg.PartitionsDefinition, fix: str = ""):
    @dg.asset(partitions_def=partitions_def, metadata=metadata)
    def events(context: dg.AssetExecutionContext) -> pd.DataFrame:
        df = frame(context)
        # The printed line, run as printed.
        exec(fix, {"pd": pd, "df": df})
        return df

    return events


def key_for(partitions_def: dg.PartitionsDefinition, day: str) -> str | dg.MultiPartitionKey:
    if isinstance(partitions_def, dg.MultiPartitionsDefinition):
        return dg.MultiPartitionKey({"time": day, "color": "red"})
    return day


@pytest.mark.parametrize(
    ("expression", "partitions_def", "column"),
    [
        ("CAST(key as DATE)", DAILY, "key_date"),
        ("strptime(key, '%Y-%m-%d')", DAILY, "key_at"),
        ("CAST(key as DATE)", MULTI, "key_date"),
    ],
    ids=["cast", "strptime", "multi"],
)
def test_an_expression_is_refused_and_the_printed_migration_works(
    tmp_path: Path, expression: str, partitions_def: dg.PartitionsDefinition, column: str
) -> None:
    database = str(tmp_path / "warehouse.duckdb")
    manager = ia.DuckDBOverwriteIOManager(database=database)
    multi = isinstance(partitions_def, dg.MultiPartitionsDefinition)
    expr: Any = {"time": expression, "color": "color"} if multi else expression
    refused_asset = asset({"partition_expr": expr}, partitions_def)
    with pytest.raises(ia.ConfigurationError) as refused:
        dg.materialize(
            [refused_asset],
            partition_key=key_for(partitions_def, "2026-01-01"),
            resources={"io_manager": manager},
        )
    message = str(refused.value)
    assert "Nothing was changed. Fix: compute the column in the asset, " in message
    assert not Path(database).exists() or _tables(database) == []

    fix = re.search(r"(df\[.*?\] = .*?) \(pandas", message)
    metadata = re.search(r"metadata=(\{.*?\})", message)
    assert fix is not None and metadata is not None
    migrated = ast.literal_eval(metadata.group(1))
    assert migrated == {"partition_expr": column}
    if multi:
        migrated = {"partition_expr": {"time": column, "color": "color"}}
    fixed = asset(migrated, partitions_def, fix.group(1))
    for day in ["2026-01-01", "2026-01-02", "2026-01-01"]:
        assert dg.materialize(
            [fixed], partition_key=key_for(partitions_def, day), resources={"io_manager": manager}
        ).success
    with duckdb.connect(database, read_only=True) as conn:
        rows = conn.execute("SELECT key, a FROM main.events ORDER BY key, a").fetchall()
    assert rows == [(d, a) for d in ["2026-01-01", "2026-01-02"] for a in (1, 2, 3)]


def _tables(database: str) -> list[tuple]:
    with duckdb.connect(database, read_only=True) as conn:
        return conn.execute("SELECT table_name FROM duckdb_tables()").fetchall()
