"""The reference's figures, out of Spark: raw Spark's appends and overwrites against ours.

Three days of 1,000 rows. Raw Spark: an append twice holds 6,000 rows; a plain overwrite of
one day in the session's default (static) mode wipes the other days; a dynamic overwrite of one
day whose batch carries one row of another day leaves that day 1 row of 1,000. Ours: 3,000
after two runs, and the stray row refused with the table unchanged.
"""

from dataclasses import replace
from typing import Any

import pyarrow as pa
import pytest

import idem_assets as ia
from idem_assets.lib.backends.spark.backend import SparkBackend
from idem_assets.worked_example import DAYS, day_batch
from tests.helpers import NOW, settings, window

METADATA: dict[str, Any] = {"partition_expr": "event_at", "primary_key": ["event_id"]}
COLUMNS = "event_id STRING, event_at TIMESTAMP_NTZ, amount DOUBLE, day DATE"


def frame(session: Any, batch: pa.Table) -> Any:
    """``batch`` with its day, in the table's column order (insertInto writes by position)."""
    from pyspark.sql import functions as F

    found = session.createDataFrame(batch).withColumn(
        "event_at", F.to_timestamp_ntz(F.date_format("event_at", "yyyy-MM-dd HH:mm:ss"))
    )
    return found.withColumn("day", F.to_date("event_at")).select(
        "event_id", "event_at", "amount", "day"
    )


def raw_table(spark: Any, schema: str, name: str) -> str:
    """A Parquet table partitioned by day, as a Spark user creates one."""
    table = f"{schema}.{name}"
    spark.sql(f"CREATE TABLE {table} ({COLUMNS}) USING parquet PARTITIONED BY (day)")
    return table


def per_day(spark: Any, table: str) -> dict[str, int]:
    """Rows per day of a raw table."""
    rows = spark.sql(f"SELECT day, count(*) FROM {table} GROUP BY day").collect()
    return {r[0].isoformat(): r[1] for r in rows}


def dynamic(spark: Any) -> Any:
    """A session of its own in dynamic overwrite mode: insertInto ignores a per-write option."""
    session = spark.newSession()
    session.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
    return session


def test_raw_append_twice_holds_6000_rows(spark: Any, schema: str) -> None:
    table = raw_table(spark, schema, "appended")
    for _run in range(2):
        for day in DAYS:
            frame(spark, day_batch(day)).write.insertInto(table)
    assert per_day(spark, table) == {d.isoformat(): 2000 for d in DAYS}


def test_raw_static_overwrite_of_one_day_wipes_the_other_days(spark: Any, schema: str) -> None:
    table = raw_table(spark, schema, "static")
    for day in DAYS:
        frame(spark, day_batch(day)).write.insertInto(table)
    # The session's default mode is static: the whole table is replaced by the day.
    assert spark.conf.get("spark.sql.sources.partitionOverwriteMode").lower() == "static"
    frame(spark, day_batch(DAYS[1])).write.insertInto(table, overwrite=True)
    assert per_day(spark, table) == {DAYS[1].isoformat(): 1000}


def test_raw_dynamic_overwrite_with_one_stray_row_leaves_1_row_of_1000(
    spark: Any, schema: str
) -> None:
    table = raw_table(spark, schema, "dynamic")
    for day in DAYS:
        frame(spark, day_batch(day)).write.insertInto(table)
    session = dynamic(spark)
    stray = pa.concat_tables([day_batch(DAYS[2]), day_batch(DAYS[0]).slice(0, 1)])
    frame(session, stray).write.insertInto(table, overwrite=True)
    counts = per_day(spark, table)
    assert counts == {DAYS[0].isoformat(): 1, DAYS[1].isoformat(): 1000, DAYS[2].isoformat(): 1000}


def test_ours_stays_3000_rows_and_refuses_the_stray_row_changing_nothing(
    spark: Any, schema: str, backend: SparkBackend
) -> None:
    write = settings("overwrite", METADATA, table="events")
    write = replace(write, schema=schema)
    after_run = []
    for _run in range(2):
        for day in DAYS:
            ia.publish(backend, day_batch(day), write, window(day.isoformat()), now=NOW)
        after_run.append(spark.table(f"{schema}.events").count())
    assert after_run == [3000, 3000]
    before = ia.table_fingerprint(backend, schema, "events")
    stray = pa.concat_tables([day_batch(DAYS[2]), day_batch(DAYS[0]).slice(0, 1)])
    with pytest.raises(ia.StrayRowsError, match=r"1 of 1001 rows have 'event_at' outside"):
        ia.publish(backend, stray, write, window(DAYS[2].isoformat()), now=NOW)
    assert ia.table_fingerprint(backend, schema, "events") == before
    rows = spark.sql(f"SELECT idem_day, count(*) FROM {schema}.events GROUP BY 1").collect()
    assert {r[0].isoformat(): r[1] for r in rows} == {d.isoformat(): 1000 for d in DAYS}


def test_raw_static_overwrite_with_an_empty_batch_empties_the_table(
    spark: Any, schema: str
) -> None:
    table = raw_table(spark, schema, "emptied")
    for day in DAYS:
        frame(spark, day_batch(day)).write.insertInto(table)
    frame(spark, day_batch(DAYS[1]).slice(0, 0)).write.insertInto(table, overwrite=True)
    assert per_day(spark, table) == {}


def test_raw_dataframe_merge_of_a_batch_with_a_repeated_key_stores_it_twice(
    spark: Any, schema: str
) -> None:
    from pyspark.sql import functions as F

    table = raw_table(spark, schema, "merged")
    for day in DAYS:
        frame(spark, day_batch(day)).write.insertInto(table)
    session = dynamic(spark)
    batch = frame(session, pa.concat_tables([day_batch(DAYS[1]), day_batch(DAYS[1]).slice(0, 1)]))
    # The usual DataFrame merge: the day's rows whose key the batch lacks, plus the batch.
    current = session.table(table).where(F.col("day") == F.lit(DAYS[1].isoformat()))
    kept = current.join(batch.select("event_id"), "event_id", "left_anti")
    kept.unionByName(batch).write.insertInto(table, overwrite=True)
    repeated = spark.sql(
        f"SELECT event_id FROM {table} GROUP BY event_id HAVING count(*) > 1"
    ).collect()
    assert len(repeated) == 1
    assert per_day(spark, table)[DAYS[1].isoformat()] == 1001


def test_ours_refuses_an_empty_batch_and_a_repeated_merge_key_changing_nothing(
    spark: Any, schema: str, backend: SparkBackend
) -> None:
    overwrite = replace(settings("overwrite", METADATA, table="events"), schema=schema)
    merge = replace(settings("merge", METADATA, table="events"), schema=schema)
    for day in DAYS:
        ia.publish(backend, day_batch(day), overwrite, window(day.isoformat()), now=NOW)
    before = ia.table_fingerprint(backend, schema, "events")
    day = DAYS[1].isoformat()
    with pytest.raises(ia.EmptyBatchError, match=r"the batch is empty but the window holds 1000"):
        ia.publish(backend, day_batch(DAYS[1]).slice(0, 0), overwrite, window(day), now=NOW)
    repeated = pa.concat_tables([day_batch(DAYS[1]), day_batch(DAYS[1]).slice(0, 1)])
    with pytest.raises(ia.DuplicateKeyError, match=r"the batch holds 1 extra row\(s\)"):
        ia.publish(backend, repeated, merge, window(day), now=NOW)
    assert ia.table_fingerprint(backend, schema, "events") == before
