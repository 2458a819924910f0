"""Spark DataFrames in and out: a DataFrame output is published by Spark jobs alone, and an
input typed as a DataFrame reads exactly its window's partitions."""

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame

import idem_assets as ia
from idem_assets.lib.backends.spark import catalog
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
    # Only aggregates and samples, if anything (the job that evaluates the frame observes what
    # the guards of an overwrite count): never a batch's rows.
    assert max((n for _, n in seen), default=0) < 100, seen
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


def merge_resources(spark_conf: dict[str, str], tmp_path: Path) -> dict[str, Any]:
    return {
        "io_manager": ia.SparkMergeIOManager(
            spark_conf=spark_conf, warehouse=str(tmp_path / "warehouse")
        ),
        "spark": ia.SparkResource(spark_conf=spark_conf),
    }


def versions(spark: Any, table: str = "main.events") -> set[str]:
    """The version directories under the table: each publish's evaluated or written copies."""
    spark.catalog.refreshTable(table)
    files = spark.table(table).inputFiles()
    root = files[0].split("/_idem_versions/")[0] if files else None
    assert root is not None
    listed = spark.sparkContext._jvm.org.apache.hadoop.fs.Path(root + "/_idem_versions")
    fs = listed.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return {str(s.getPath().getName()) for s in fs.listStatus(listed)}


def upsert_asset(ticks: Path, version: int) -> dg.AssetsDefinition:
    """The day's events as an upsert: version 0 all of them, later ones the even ids changed
    and 100 new ids; every row passes a counting UDF."""

    @dg.asset(
        name="events",
        partitions_def=DAILY,
        metadata={**METADATA, "delete_missing": False},
    )
    def events(context: dg.AssetExecutionContext, spark: ia.SparkResource) -> DataFrame:
        day = day_frame(spark.session(), context.partition_key, version)
        if version:
            new = day.limit(100).withColumn("event_id", F.col("event_id") + ROWS)
            day = day.where(F.col("event_id") % 2 == 0).unionByName(new)
        return day.withColumn("event_id", _counted(str(ticks))(F.col("event_id")))

    return events


def test_a_dataframe_upsert_keeps_the_days_other_keys_and_evaluates_once(
    spark: Any, spark_conf: dict[str, str], tmp_path: Path
) -> None:
    ticks = tmp_path / "ticks"
    ticks.touch()
    res = merge_resources(spark_conf, tmp_path)
    dg.materialize([upsert_asset(ticks, 0)], resources=res, partition_key="2026-01-02")
    result = dg.materialize([upsert_asset(ticks, 1)], resources=res, partition_key="2026-01-02")
    assert len(ticks.read_text()) == ROWS + ROWS // 2 + 100
    stored = spark.table("main.events")
    assert stored.count() == ROWS + 100
    # Odd ids keep version 0; even ids and the new ids hold version 1.
    expected = (
        day_frame(spark, "2026-01-02", 0)
        .where(F.col("event_id") % 2 == 1)
        .unionByName(day_frame(spark, "2026-01-02", 1).where(F.col("event_id") % 2 == 0))
        .unionByName(
            day_frame(spark, "2026-01-02", 1)
            .limit(100)
            .withColumn("event_id", F.col("event_id") + ROWS)
        )
    )
    assert (
        stored.exceptAll(expected.select(*stored.columns[:3], F.to_date("event_at"))).count() == 0
    )
    md = result.asset_materializations_for_node("events")[0].metadata
    assert (md["rows_updated"].value, md["rows_inserted"].value) == (ROWS // 2, 100)
    assert md["dagster/row_count"].value == ROWS + 100
    window = ia.window_from_keys(DAILY, ["2026-01-02"], "events")
    fingerprint = ia.table_fingerprint(SparkBackend(spark), "main", "events", "event_at", window)
    assert md["fingerprint"].value == fingerprint


def test_a_dataframe_merge_of_a_key_stored_on_another_day_is_refused_leaving_no_copy(
    spark: Any, spark_conf: dict[str, str], tmp_path: Path
) -> None:
    res = merge_resources(spark_conf, tmp_path)
    dg.materialize([events_asset()], resources=res, partition_key="2026-01-02")
    before = ia.table_fingerprint(SparkBackend(spark), "main", "events")
    copies = versions(spark)

    @dg.asset(name="events", partitions_def=DAILY, metadata=METADATA)
    def moved(context: dg.AssetExecutionContext, spark: ia.SparkResource) -> DataFrame:
        day = day_frame(spark.session(), context.partition_key)
        # One event of 2026-01-02 again, now dated the 3rd.
        stolen = day_frame(spark.session(), "2026-01-02").limit(1)
        stolen = stolen.withColumn("event_at", F.col("event_at") + F.expr("INTERVAL 1 DAY"))
        return day.unionByName(stolen)

    with pytest.raises(ia.KeyOutsideWindowError, match=r"1 key\(s\) of the batch already exist"):
        dg.materialize([moved], resources=res, partition_key="2026-01-03")
    assert ia.table_fingerprint(SparkBackend(spark), "main", "events") == before
    assert versions(spark) == copies


def test_a_dataframe_refused_before_staging_leaves_no_copy(
    spark: Any, spark_conf: dict[str, str], tmp_path: Path
) -> None:
    res = resources(spark_conf, tmp_path)
    dg.materialize([events_asset()], resources=res, partition_key="2026-01-02")
    copies = versions(spark)

    @dg.asset(name="events", partitions_def=DAILY, metadata=METADATA)
    def wider(context: dg.AssetExecutionContext, spark: ia.SparkResource) -> DataFrame:
        return day_frame(spark.session(), context.partition_key).withColumn("note", F.lit("x"))

    with pytest.raises(ia.SchemaMismatchError, match="note"):
        dg.materialize([wider], resources=res, partition_key="2026-01-02")
    assert versions(spark) == copies


def test_a_dataframe_cast_to_the_tables_types_is_written_as_stored(
    spark: Any, spark_conf: dict[str, str], tmp_path: Path
) -> None:
    res = resources(spark_conf, tmp_path)
    dg.materialize([events_asset()], resources=res, partition_key="2026-01-02")

    @dg.asset(name="events", partitions_def=DAILY, metadata=METADATA)
    def narrow(context: dg.AssetExecutionContext, spark: ia.SparkResource) -> DataFrame:
        day = day_frame(spark.session(), context.partition_key, 1)
        return day.withColumn("amount", F.col("amount").cast("int"))

    dg.materialize([narrow], resources=res, partition_key="2026-01-02")
    stored = spark.table("main.events")
    assert dict(stored.dtypes)["amount"] == "double"
    assert stored.count() == ROWS
    assert (
        stored.agg(F.sum("amount")).first()[0]
        == day_frame(spark, "2026-01-02", 1).agg(F.sum("amount")).first()[0]
    )


def test_a_dataframe_whose_commit_is_lost_starts_over_on_its_one_evaluation(
    spark: Any, schema: str, backend: SparkBackend, tmp_path: Path
) -> None:
    from tests.helpers import NOW, settings, window

    ticks = tmp_path / "ticks"
    ticks.touch()
    write = replace(settings("overwrite", METADATA, table="events"), schema=schema)
    day = "2026-01-02"
    ia.publish(backend, backend.evaluate(day_frame(spark, day), write), write, window(day), now=NOW)
    counted = day_frame(spark, day, 2).withColumn(
        "event_id", _counted(str(ticks))(F.col("event_id"))
    )
    other = backend.evaluate(day_frame(spark, day, 1), write)
    stages: list[str] = []

    def another_writer_commits_first(stage: str) -> None:
        stages.append(stage)
        if stages.count("before_commit") == 1 and stage == "before_commit":
            ia.publish(backend, other, write, window(day), now=NOW)

    batch = backend.evaluate(counted, write)
    ia.publish(backend, batch, write, window(day), now=NOW, on_stage=another_writer_commits_first)
    # Two attempts, one evaluation.
    assert stages.count("guards_passed") == 2
    assert len(ticks.read_text()) == ROWS
    stored = spark.table(f"{schema}.events")
    assert stored.count() == ROWS
    assert stored.agg(F.min("amount")).first()[0] == 2


HOURLY = dg.HourlyPartitionsDefinition(start_date="2026-01-01-00:00")


def small_day(spark: Any, day: str, rows: int = 48) -> DataFrame:
    """``rows`` events of ``day``, one every 30 minutes from midnight, ids unique per day."""
    return spark.range(rows).select(
        (F.lit(int(day.replace("-", "")) * 100_000) + F.col("id")).alias("event_id"),
        (
            F.to_timestamp_ntz(F.lit(f"{day} 00:00:00")) + F.make_interval(mins=F.col("id") * 30)
        ).alias("event_at"),
        F.col("id").cast("double").alias("amount"),
    )


def _null(frame: DataFrame, column: str, ids: int) -> DataFrame:
    """``frame`` with ``column`` NULL in its first ``ids`` rows (by ``amount``)."""
    kind = dict(frame.dtypes)[column]
    return frame.withColumn(
        column, F.when(F.col("amount") < ids, F.lit(None).cast(kind)).otherwise(F.col(column))
    )


def _doubled(frame: DataFrame, rows: int) -> DataFrame:
    """``frame`` with its first ``rows`` rows (by ``amount``) again, 1000 added to ``amount``."""
    return frame.unionByName(
        frame.where(F.col("amount") < rows).withColumn("amount", F.col("amount") + 1000)
    )


def _moved(frame: DataFrame, rows: int, by: str) -> DataFrame:
    """``frame`` with the event time of its first ``rows`` rows moved by interval ``by``."""
    later = F.col("event_at") + F.expr(f"INTERVAL {by}")
    return frame.withColumn(
        "event_at", F.when(F.col("amount") < rows, later).otherwise(F.col("event_at"))
    )


def _stolen(spark: Any, frame: DataFrame) -> DataFrame:
    """``frame`` plus one event of 2026-01-01 (stored) again, dated like the batch's first."""
    first = frame.where(F.col("amount") == 0).select("event_at")
    other = small_day(spark, "2026-01-01").where(F.col("amount") == 1).drop("event_at")
    return frame.unionByName(other.crossJoin(first).select(*frame.columns))


@dataclass(frozen=True)
class Refused:
    """A DataFrame a guard refuses: what it writes where, how its rows are spoilt, the refusal."""

    mode: str
    #: The partition written, and those stored before (none: no table yet).
    key: str
    stored: tuple[str, ...]
    change: Callable[[Any, DataFrame], DataFrame]
    error: type[Exception]
    message: str
    hourly: bool = False
    #: False: Spark broadcasts no side of a join (a batch too big to), so the merge's join
    #: with the stored rows is a sort-merge one.
    broadcast: bool = True


TWO_DAYS = ("2026-01-01", "2026-01-02")
REFUSED = {
    "null key": Refused(
        "overwrite", "2026-01-02", TWO_DAYS, lambda s, f: _null(f, "event_id", 2),
        ia.NullValueError, "2 rows have NULL in key",
    ),
    "null time": Refused(
        "overwrite", "2026-01-02", TWO_DAYS, lambda s, f: _null(f, "event_at", 1),
        ia.NullValueError, "1 of 48 rows have NULL",
    ),
    "stray": Refused(
        "overwrite", "2026-01-02", TWO_DAYS, lambda s, f: _moved(f, 1, "1 DAY"),
        ia.StrayRowsError, "1 of 48 rows have 'event_at'",
    ),
    "stray, a day before": Refused(
        "overwrite", "2026-01-02", TWO_DAYS, lambda s, f: _moved(f, 2, "-1 DAY"),
        ia.StrayRowsError, "2 of 48 rows have 'event_at'",
    ),
    "stray hour, same day": Refused(
        "overwrite", "2026-01-02-05:00", ("2026-01-02-05:00",),
        lambda s, f: _moved(f, 1, "3 HOURS"), ia.StrayRowsError, "1 of 2 rows have 'event_at'",
        hourly=True,
    ),
    "duplicates": Refused(
        "merge", "2026-01-02", TWO_DAYS, lambda s, f: _doubled(f, 3),
        ia.DuplicateKeyError, "holds 3 extra row(s)",
    ),
    "duplicates, new day": Refused(
        "merge", "2026-01-03", TWO_DAYS, lambda s, f: _doubled(f, 2),
        ia.DuplicateKeyError, "holds 2 extra row(s)",
    ),
    "duplicates, new table": Refused(
        "merge", "2026-01-02", (), lambda s, f: _doubled(f, 2),
        ia.DuplicateKeyError, "holds 2 extra row(s)",
    ),
    "duplicates and a null key": Refused(
        "merge", "2026-01-02", ("2026-01-02",), lambda s, f: _null(_doubled(f, 3), "event_id", 1),
        ia.NullValueError, "1 rows have NULL",
    ),
    "duplicates and a stray row": Refused(
        "merge", "2026-01-02", ("2026-01-02",), lambda s, f: _moved(_doubled(f, 3), 1, "1 DAY"),
        ia.StrayRowsError, "1 of 51 rows",
    ),
    "duplicates and a key elsewhere": Refused(
        "merge", "2026-01-02", TWO_DAYS, lambda s, f: _stolen(s, _doubled(f, 1)),
        ia.DuplicateKeyError, "holds 1 extra row(s)",
    ),
    "duplicates, sort-merge join": Refused(
        "merge", "2026-01-02", TWO_DAYS, lambda s, f: _doubled(f, 3),
        ia.DuplicateKeyError, "holds 3 extra row(s)", broadcast=False,
    ),
    "key elsewhere, sort-merge join": Refused(
        "merge", "2026-01-02", TWO_DAYS, lambda s, f: _stolen(s, f),
        ia.KeyOutsideWindowError, "1 key(s) of the batch already", broadcast=False,
    ),
    "key elsewhere": Refused(
        "merge", "2026-01-02", TWO_DAYS, lambda s, f: _stolen(s, f),
        ia.KeyOutsideWindowError, "1 key(s) of the batch already",
    ),
    "stray, merge": Refused(
        "merge", "2026-01-02", TWO_DAYS, lambda s, f: _moved(f, 1, "1 DAY"),
        ia.StrayRowsError, "1 of 48 rows have 'event_at'",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", REFUSED.values(), ids=REFUSED.keys())
def test_a_refused_dataframe_is_refused_as_its_arrow_rows_and_changes_nothing(
    spark: Any, schema: str, backend: SparkBackend, case: Refused
) -> None:
    """Every guard refuses a DataFrame with the message it gives the same rows sent as Arrow.

    The DataFrame's guards count what the job evaluating it observed, or ride on the merge's
    join; the Arrow batch's are the embedded evaluator's queries: the two must agree, and
    neither may change the table or leave a copy behind.
    """
    from tests.helpers import NOW, settings

    parts = HOURLY if case.hourly else DAILY
    extra = {"delete_missing": False} if case.mode == "merge" else {}
    metadata = {**METADATA, **extra}
    write = replace(
        settings(case.mode, metadata, table="events", partitions_def=parts), schema=schema
    )
    put = replace(write, mode="overwrite")

    def win(key: str) -> ia.WriteWindow:
        return ia.window_from_keys(parts, [key], "events")

    def frame_of(key: str) -> DataFrame:
        if not case.hourly:
            return small_day(spark, key)
        hour = int(key[11:13])
        # The hour's two events, their amounts counted from 0 as a day's are.
        found = small_day(spark, key[:10]).where(F.hour("event_at") == hour)
        return found.withColumn("amount", F.col("amount") - 2 * hour)

    for key in case.stored:
        ia.publish(backend, backend.evaluate(frame_of(key), put), put, win(key), now=NOW)
    table = f"{schema}.events"
    before = ia.table_fingerprint(backend, schema, "events")
    copies = versions(spark, table) if case.stored else set()
    sent = case.change(spark, frame_of(case.key))
    rows = sent.toArrow()
    threshold = "spark.sql.autoBroadcastJoinThreshold"
    default = spark.conf.get(threshold)
    spark.conf.set(threshold, "10MB" if case.broadcast else "-1")
    try:
        with pytest.raises(case.error, match=re.escape(case.message)) as as_frame:
            ia.publish(backend, backend.evaluate(sent, write), write, win(case.key), now=NOW)
    finally:
        spark.conf.set(threshold, default)
    with pytest.raises(case.error) as as_arrow:
        ia.publish(backend, rows, write, win(case.key), now=NOW)

    def decided(exc: BaseException) -> str:
        """The refusal without its sample (Spark's and DuckDB's pick their rows differently)."""
        found = str(exc)
        for word in ("Sample:", "Existing rows:"):
            found = found.split(word)[0]
        return found

    assert decided(as_frame.value) == decided(as_arrow.value)
    assert ia.table_fingerprint(backend, schema, "events") == before
    if case.stored:
        assert versions(spark, table) == copies
    else:
        assert not catalog.table_exists(spark, schema, "events")
