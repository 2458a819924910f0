"""Spark DataFrames in and out: a DataFrame output is published by Spark jobs alone, and an
input typed as a DataFrame reads exactly its window's partitions."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame

import idem_assets as ia
from idem_assets.lib.backends.spark.backend import SparkBackend
from tests.helpers import DAILY
from tests.spark_session import drop_schema

ROWS = 20_000
METADATA: dict[str, Any] = {"partition_expr": "event_at", "primary_key": ["event_id"]}
#: The DataFrame methods through which rows reach the driver.
FETCHES = ("collect", "toArrow", "toPandas", "toLocalIterator", "take", "head", "tail")


@contextmanager
def rows_to_driver() -> Iterator[list[tuple[str, int]]]:
    """Every fetch of rows into Python while the body runs, with its row count.

    The real methods run; each call is recorded, so a test can show that a batch never
    reached the driver (only aggregates and samples did).
    """
    seen: list[tuple[str, int]] = []
    # The session's DataFrames are classic ones, which implement each method themselves.
    originals = {name: getattr(ClassicDataFrame, name) for name in FETCHES}

    def spy(name: str) -> Any:
        original = originals[name]

        def fetch(self: DataFrame, *args: Any, **kwargs: Any) -> Any:
            found = original(self, *args, **kwargs)
            size = found.num_rows if hasattr(found, "num_rows") else None
            if size is None:
                size = len(found) if hasattr(found, "__len__") else -1
            seen.append((name, size))
            return found

        return fetch

    for name in FETCHES:
        setattr(ClassicDataFrame, name, spy(name))
    try:
        yield seen
    finally:
        for name, original in originals.items():
            setattr(ClassicDataFrame, name, original)


def day_frame(spark: Any, day: str, version: int = 0, stray: bool = False) -> DataFrame:
    """``ROWS`` events of ``day`` built in Spark (and one of the next day with ``stray``)."""
    found = spark.range(ROWS).select(
        (F.lit(int(day.replace("-", "")) * 100_000) + F.col("id")).alias("event_id"),
        (
            F.to_timestamp_ntz(F.lit(f"{day} 00:00:00")) + F.make_interval(secs=F.col("id") * 4)
        ).alias("event_at"),
        ((F.col("id") % 97) + version).cast("double").alias("amount"),
    )
    if stray:
        found = found.unionByName(
            found.limit(1).withColumn("event_at", F.col("event_at") + F.expr("INTERVAL 1 DAY"))
        )
    return found


@pytest.fixture(autouse=True)
def empty_main(spark: Any) -> None:
    """The assets here write schema main of the worker's catalog: each test starts without it."""
    drop_schema(spark, "main")


def resources(spark_conf: dict[str, str], tmp_path: Path) -> dict[str, Any]:
    return {
        "io_manager": ia.SparkOverwriteIOManager(
            spark_conf=spark_conf, warehouse=str(tmp_path / "warehouse")
        ),
        "spark": ia.SparkResource(spark_conf=spark_conf),
    }


def events_asset(version: int = 0, stray: bool = False) -> dg.AssetsDefinition:
    @dg.asset(name="events", partitions_def=DAILY, metadata=METADATA)
    def events(context: dg.AssetExecutionContext, spark: ia.SparkResource) -> DataFrame:
        return day_frame(spark.session(), context.partition_key, version, stray)

    return events


def test_a_dataframe_output_is_published_without_reaching_the_driver(
    spark: Any, spark_conf: dict[str, str], tmp_path: Path
) -> None:
    with rows_to_driver() as seen:
        for version in (0, 1):
            dg.materialize(
                [events_asset(version)],
                resources=resources(spark_conf, tmp_path),
                partition_key="2026-01-02",
            )
    # Only aggregates, catalog reads and fingerprints: never a batch's rows.
    assert seen and max(n for _, n in seen) < 100, seen
    stored = spark.table("main.events")
    assert stored.count() == ROWS
    assert (
        stored.agg(F.sum("amount")).first()[0]
        == day_frame(spark, "2026-01-02", 1).agg(F.sum("amount")).first()[0]
    )


def test_a_dataframe_with_a_stray_row_is_refused_and_nothing_changes(
    spark: Any, spark_conf: dict[str, str], tmp_path: Path
) -> None:
    res = resources(spark_conf, tmp_path)
    dg.materialize([events_asset()], resources=res, partition_key="2026-01-02")
    backend = SparkBackend(spark)
    before = ia.table_fingerprint(backend, "main", "events")
    with pytest.raises(ia.StrayRowsError, match=rf"1 of {ROWS + 1} rows have 'event_at' outside"):
        dg.materialize([events_asset(1, stray=True)], resources=res, partition_key="2026-01-02")
    assert ia.table_fingerprint(backend, "main", "events") == before


def test_a_dataframe_input_reads_only_its_days_partition(
    spark: Any, spark_conf: dict[str, str], tmp_path: Path
) -> None:
    res = resources(spark_conf, tmp_path)
    for day in ("2026-01-01", "2026-01-02", "2026-01-03"):
        dg.materialize([events_asset()], resources=res, partition_key=day)
    read: dict[str, Any] = {}

    @dg.asset(partitions_def=DAILY, io_manager_key="memory")
    def daily_total(events: DataFrame) -> int:
        read["files"] = events.inputFiles()
        read["rows"] = events.count()
        read["days"] = {r[0] for r in events.select(F.to_date("event_at")).distinct().collect()}
        return read["rows"]

    dg.materialize(
        [events_asset(), daily_total],
        resources={**res, "memory": dg.InMemoryIOManager()},
        partition_key="2026-01-02",
        selection=[daily_total.key],
    )
    assert read["rows"] == ROWS
    assert {d.isoformat() for d in read["days"]} == {"2026-01-02"}
    assert read["files"] and all("idem_day=2026-01-02" in f for f in read["files"]), read["files"]


def _counted(ticks: str) -> Any:
    """A Python UDF passing ``id`` through that appends one byte to ``ticks`` per row it sees."""

    def tick(i):  # untyped: with type hints Spark would take it for a pandas UDF
        with open(ticks, "a") as f:
            f.write(".")
        return i

    return F.udf(tick, "long")


def test_a_dataframe_output_is_evaluated_once_for_every_check_and_the_write(
    spark: Any, spark_conf: dict[str, str], tmp_path: Path
) -> None:
    ticks = tmp_path / "ticks"
    ticks.touch()

    @dg.asset(name="events", partitions_def=DAILY, metadata=METADATA)
    def events(spark: ia.SparkResource) -> DataFrame:
        base = spark.session().range(500)
        return base.select(
            (F.lit(2026010200000) + _counted(str(ticks))(F.col("id"))).alias("event_id"),
            (
                F.to_timestamp_ntz(F.lit("2026-01-02 00:00:00"))
                + F.make_interval(secs=F.col("id") * 60)
            ).alias("event_at"),
            F.col("id").cast("double").alias("amount"),
        )

    dg.materialize([events], resources=resources(spark_conf, tmp_path), partition_key="2026-01-02")
    # One evaluation: the probe, the guards and the write read its rows, not the frame again.
    assert len(ticks.read_text()) == 500
    assert spark.table("main.events").count() == 500
