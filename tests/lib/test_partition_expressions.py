"""partition_expr as an SQL expression (dagster-duckdb's "CAST(time as DATE)"), on DuckDB.

A pure, deterministic expression over the batch's columns scopes the write: rerunning its
partition replaces it. Anything else is refused before anything is written, with the change
that works. One builder renders the expression in every engine's dialect, cast to its type.
"""

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import pandas as pd
import pyarrow as pa
import pytest

import idem_assets as ia
from idem_assets.lib.model.windows import Condition
from idem_assets.lib.sql.predicates import region_sql
from tests.helpers import DAILY

REGIONS = dg.StaticPartitionsDefinition(["red", "blue"])
MULTI = dg.MultiPartitionsDefinition({"time": DAILY, "color": REGIONS})


def frame(context: dg.AssetExecutionContext, value: int) -> pd.DataFrame:
    """Three rows whose 'key' is the day as text, as dagster-duckdb's own tests write it."""
    key = context.partition_key
    day = key.keys_by_dimension["time"] if isinstance(key, dg.MultiPartitionKey) else key
    return pd.DataFrame({"key": [day] * 3, "color": ["red"] * 3, "a": [value] * 3})


def asset(metadata: dict[str, Any], partitions_def: dg.PartitionsDefinition, value: int = 1):
    @dg.asset(partitions_def=partitions_def, metadata=metadata)
    def events(context: dg.AssetExecutionContext) -> pd.DataFrame:
        return frame(context, value)

    return events


def key_for(partitions_def: dg.PartitionsDefinition, day: str) -> str | dg.MultiPartitionKey:
    if isinstance(partitions_def, dg.MultiPartitionsDefinition):
        return dg.MultiPartitionKey({"time": day, "color": "red"})
    return day


def resolved(expression: Any, **kwargs: Any) -> ia.WriteSettings:
    return ia.resolve_settings(
        asset_key=dg.AssetKey(["events"]),
        metadata={"partition_expr": expression},
        mode="overwrite",
        default_schema="main",
        partitions_def=kwargs.pop("partitions_def", DAILY),
        **kwargs,
    )


@pytest.mark.parametrize(
    ("expression", "partitions_def"),
    [
        ("CAST(key as DATE)", DAILY),
        ("strptime(key, '%Y-%m-%d')", DAILY),
        ("CAST(key as DATE)", MULTI),
    ],
    ids=["cast", "strptime", "multi"],
)
def test_an_expression_scopes_the_write_and_a_rerun_replaces_it(
    tmp_path: Path, expression: str, partitions_def: dg.PartitionsDefinition
) -> None:
    database = str(tmp_path / "warehouse.duckdb")
    manager = ia.DuckDBOverwriteIOManager(database=database)
    multi = isinstance(partitions_def, dg.MultiPartitionsDefinition)
    expr: Any = {"time": expression, "color": "color"} if multi else expression
    for day, value in [("2026-01-01", 1), ("2026-01-02", 2), ("2026-01-01", 3), ("2026-01-01", 3)]:
        assert dg.materialize(
            [asset({"partition_expr": expr}, partitions_def, value)],
            partition_key=key_for(partitions_def, day),
            resources={"io_manager": manager},
        ).success
    with duckdb.connect(database, read_only=True) as conn:
        rows = conn.execute("SELECT key, color, a FROM main.events ORDER BY ALL").fetchall()
    assert rows == [("2026-01-01", "red", 3)] * 3 + [("2026-01-02", "red", 2)] * 3


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("now()", "gives another value on every run"),
        ("CAST(key AS DATE) + random()", "gives another value on every run"),
        ("CAST(current_timestamp AS DATE)", "gives another value on every run"),
        ("CAST(uuid() AS DATE)", "gives another value on every run"),
        ("(SELECT max(day) FROM other)", "is a query or a statement"),
        ("CAST(max(key) AS DATE)", "is an aggregate"),
        ("CAST(lag(key) OVER () AS DATE)", "is a window function"),
        ("CAST(t.key AS DATE)", "names a table"),
        ("CAST($1 AS DATE)", "is a parameter"),
        ("my_udf(key)", "calls my_udf(), which this library does not know"),
        ("CAST(key AS TIMESTAMPTZ)", "depends on the session's TimeZone"),
        ("CAST(TO_TIMESTAMP(CAST(key AS INT)) AS DATE)", "reads a date or a time of day out of"),
        ("date_trunc('day', TO_TIMESTAMP(CAST(key AS INT)))", "depends on the session's"),
        ("CAST(key AS TIMESTAMP_S)", "which not every engine spells"),
        ("key || ''", "gives string; the window is compared with a DATE or TIMESTAMP"),
        ("CAST(key AS INT) + 1", "has no result type this library can tell"),
    ],
)
def test_an_unsafe_expression_is_refused_with_its_fix(expression: str, why: str) -> None:
    with pytest.raises(ia.ConfigurationError) as refused:
        resolved(expression)
    message = str(refused.value)
    assert f"metadata 'partition_expr' is the SQL expression {expression!r}" in message
    assert message.startswith("Refused: asset 'events': ")
    assert why in message
    assert "Nothing was changed. Fix: " in message
    assert "compute the column in the asset, df['" in message


def test_a_category_dimension_takes_an_expression_giving_its_key() -> None:
    pairs = resolved({"time": "CAST(key AS DATE)", "color": "lower(color)"}, partitions_def=MULTI)
    # Dimensions in Dagster's order (by name).
    assert pairs.partition_columns == (("color", 'LOWER("color")'), ("time", 'CAST("key" AS DATE)'))
    with pytest.raises(ia.ConfigurationError, match=r"a partition key \(text, or an integer\)"):
        resolved(
            {"time": "CAST(key AS DATE)", "color": "CAST(color AS DATE)"}, partitions_def=MULTI
        )


def test_an_expression_is_read_in_the_engines_dialect() -> None:
    """PostgreSQL's to_timestamp and DuckDB's strptime are one expression, kept in one spelling."""
    pg = resolved("to_timestamp(key, 'YYYY-MM-DD')", dialect="postgres")
    duck = resolved("strptime(key, '%Y-%m-%d')")
    assert (
        pg.partition_columns == duck.partition_columns == (("", "STRPTIME(\"key\", '%Y-%m-%d')"),)
    )


def test_an_engine_without_expressions_refuses_one_with_the_column_to_compute() -> None:
    with pytest.raises(ia.ConfigurationError) as refused:
        resolved("CAST(time AS DATE)", dialect=None, engine="Delta Lake")
    assert str(refused.value).endswith(
        "but Delta Lake scopes a write by the stored partition column itself (its files are laid"
        " out and pruned by that column), so it cannot evaluate an expression for the window."
        " Nothing was changed. Fix: compute the column in the asset, df['time_date'] ="
        " pd.to_datetime(df['time']).dt.date (pandas), and name it: metadata={'partition_expr':"
        " 'time_date'} (for a dg.MultiPartitionsDefinition, that dimension's entry)."
    )


def test_one_builder_renders_the_window_per_dialect_with_values_bound() -> None:
    term = resolved("to_timestamp(key, 'YYYY-MM-DD')", dialect="postgres").time_column
    assert term is not None
    start, end = datetime(2026, 1, 1), datetime(2026, 1, 2)
    region = ((Condition(term, spans=((start, end),)),),)
    duck, pg = region_sql(region, "duckdb"), region_sql(region, "postgres")
    assert duck.sql == (
        "(CAST(STRPTIME(\"key\", '%Y-%m-%d') AS TIMESTAMP) >= $1"
        " AND CAST(STRPTIME(\"key\", '%Y-%m-%d') AS TIMESTAMP) < $2)"
    )
    assert pg.sql == (
        "(CAST(TO_TIMESTAMP(\"key\", 'YYYY-MM-DD') AS TIMESTAMP) >= $1"
        " AND CAST(TO_TIMESTAMP(\"key\", 'YYYY-MM-DD') AS TIMESTAMP) < $2)"
    )
    assert duck.params == pg.params == [start, end]


def test_an_expression_over_a_zoned_timestamp_is_refused_with_the_column_itself(
    tmp_path: Path,
) -> None:
    conn = duckdb.connect(str(tmp_path / "warehouse.duckdb"))
    batch = pa.table(
        {"at": pa.array([datetime(2026, 1, 1, 5, tzinfo=UTC)], pa.timestamp("us", "UTC"))}
    )
    window = ia.window_from_keys(DAILY, ["2026-01-01"], "events")
    with pytest.raises(ia.SchemaMismatchError) as refused:
        ia.publish(conn, batch, resolved("CAST(at AS DATE)"), window)
    assert "depends on the session's TimeZone setting" in str(refused.value)
    assert str(refused.value).endswith(
        "Nothing was changed. Fix: name the column itself, metadata={'partition_expr': 'at'}:"
        " the window then compares instants, in the partitions' own time zone."
    )
    assert conn.execute("SELECT count(*) FROM duckdb_tables()").fetchone() == (0,)


def test_an_audited_asset_refuses_an_expression_with_the_column_to_compute() -> None:
    with pytest.raises(ia.ConfigurationError, match=r"df\['key_date'\] = pd.to_datetime"):

        @ia.audited_asset(partitions_def=DAILY, metadata={"partition_expr": "CAST(key AS DATE)"})
        def audited(context: dg.AssetExecutionContext) -> pd.DataFrame:
            return frame(context, 1)


def test_a_plan_reads_its_upstream_s_planned_rows_through_the_expression(tmp_path: Path) -> None:
    """A plan run splits the stored rows by the expression, as the guards place them."""
    database = str(tmp_path / "warehouse.duckdb")
    resources = {"io_manager": ia.DuckDBOverwriteIOManager(database=database)}
    metadata = {"partition_expr": "CAST(key AS DATE)"}
    value = {"events": 1}
    seen: list[list[tuple[str, int]]] = []

    @dg.asset(partitions_def=DAILY, metadata=metadata)
    def events(context: dg.AssetExecutionContext) -> pd.DataFrame:
        return frame(context, value["events"])

    @dg.asset(partitions_def=DAILY, metadata=metadata)
    def doubled(events: pd.DataFrame) -> pd.DataFrame:
        seen.append(sorted(zip(events["key"], events["a"], strict=True)))
        return events.assign(a=events["a"] * 2)

    with dg.DagsterInstance.ephemeral() as instance:
        for day in ["2026-01-01", "2026-01-02"]:
            dg.materialize(
                [events, doubled], partition_key=day, resources=resources, instance=instance
            )
        value["events"] = 5
        planned = dg.materialize(
            [events, doubled],
            partition_key="2026-01-01",
            resources=resources,
            instance=instance,
            tags=dict(ia.PLAN_TAGS),
        )
    assert planned.success
    assert seen[-1] == [("2026-01-01", 5)] * 3
    with duckdb.connect(database, read_only=True) as conn:
        stored = conn.execute("SELECT key, a FROM main.doubled ORDER BY ALL").fetchall()
    assert stored == [("2026-01-01", 2)] * 3 + [("2026-01-02", 2)] * 3
