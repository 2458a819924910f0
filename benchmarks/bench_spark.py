"""10. Spark: our overwrite and merge of a day built in Spark vs raw Spark's own calls.

Everything runs in one local Spark session (its Derby metastore in the work directory). The
day is a DataFrame built by Spark (never collected): ours stages it once as Parquet, judges it
with Spark jobs and swaps the day's partition in with one metastore call; raw Spark writes it
with ``insertInto(overwrite=True)`` in dynamic partition overwrite mode (set on a child session:
insertInto ignores a per-write option). The guards' share is the time from the publish's start
to its ``guards_passed`` stage.
"""

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks import data
from benchmarks.harness import Case, Line, Scale, interleave, line_from_times

#: Rows of the written day, rounds, and the other days the tables hold besides it (at the
#: tiny scale one: make test's smoke run proves the benchmark runs, and each day is ten Spark
#: jobs more).
SIZES: dict[Scale, tuple[int, int, int]] = {"tiny": (5_000, 1, 1), "full": (1_000_000, 3, 4)}
OTHER_DAYS = SIZES["full"][2]
METADATA: dict[str, Any] = {"partition_expr": "pickup_at", "primary_key": ["trip_id"]}
#: Raw Spark's merge keeps the day's stored rows whose key the batch lacks; ours does the same
#: with delete_missing off (on, the merge IO manager's default, it would delete them).
MERGE: dict[str, Any] = {"delete_missing": False}


def settings(mode: str, table: str) -> Any:
    """Our table's write settings: ``mode`` into ``bench.<table>``, a merge keeping old keys."""
    extra = MERGE if mode == "merge" else {}
    return replace(data.settings(mode, **extra), schema="bench", table=table)  # type: ignore[arg-type]


def _session(workdir: Path) -> Any:
    from idem_assets.lib.backends.spark.session import spark_session

    root = workdir.resolve()
    return spark_session(
        {
            "spark.master": "local[2]",
            "spark.sql.shuffle.partitions": "2",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.sql.session.timeZone": "UTC",
            "spark.driver.memory": "2g",
            "spark.sql.warehouse.dir": str(root / "warehouse"),
            "spark.hadoop.javax.jdo.option.ConnectionURL": (
                f"jdbc:derby:;databaseName={root / 'metastore_db'};create=true"
            ),
            "spark.driver.extraJavaOptions": f"-Dderby.system.home={root}",
            "spark.local.dir": str(root / "local"),
        }
    )


def day_frame(spark: Any, day: int, rows: int, version: int = 0) -> Any:
    """``rows`` trips of ``day`` built by Spark: ids, pickups spread over the day, fares."""
    from pyspark.sql import functions as F

    start, _ = data.day_bounds(day)
    step = 86_400_000_000 // rows
    return spark.range(rows).select(
        (F.lit(day * data.ID_STRIDE) + F.col("id")).alias("trip_id"),
        F.timestamp_micros(F.lit(int(start.timestamp()) * 1_000_000) + F.col("id") * step)
        .cast("timestamp_ntz")
        .alias("pickup_at"),
        (F.col("id") % 97 + version).cast("double").alias("fare"),
    )


def _raw_table(spark: Any, name: str) -> str:
    table = f"bench.{name}"
    spark.sql(
        f"CREATE TABLE {table} (trip_id BIGINT, pickup_at TIMESTAMP_NTZ, fare DOUBLE, day DATE)"
        " USING parquet PARTITIONED BY (day)"
    )
    return table


def _with_day(frame: Any) -> Any:
    from pyspark.sql import functions as F

    return frame.withColumn("day", F.to_date("pickup_at"))


@dataclass(frozen=True)
class Tables:
    """Raw Spark's two tables, the child session that writes them in dynamic mode, the day."""

    raw: str
    raw_merged: str
    dynamic: Any
    #: The day every side replaces: the last of the tables' days.
    day: int


def build_tables(spark: Any, backend: Any, rows: int, other_days: int = OTHER_DAYS) -> Tables:
    """Our two tables and raw Spark's, each holding ``other_days + 1`` days of ``rows`` trips."""
    import idem_assets as ia

    dynamic = spark.newSession()
    dynamic.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
    raw = _raw_table(spark, "raw")
    raw_merged = _raw_table(spark, "raw_merge")
    for d in range(other_days + 1):
        for table in ("ours", "ours_merge"):
            named = settings("overwrite", table)
            frame = backend.evaluate(day_frame(spark, d, rows), named)
            ia.publish(backend, frame, named, data.window([d]), now=data.NOW)
        for table in (raw, raw_merged):
            _with_day(day_frame(spark, d, rows)).write.insertInto(table)
    return Tables(raw, raw_merged, dynamic, other_days)


def raw_overwrite(tables: Tables, rows: int) -> None:
    """Raw Spark replaces the day: ``insertInto(overwrite=True)`` in dynamic mode."""
    frame = day_frame(tables.dynamic, tables.day, rows, 1)
    _with_day(frame).write.insertInto(tables.raw, overwrite=True)


def raw_merge(tables: Tables, rows: int) -> None:
    """Raw Spark merges the day: the stored rows whose key the batch lacks, plus the batch."""
    from pyspark.sql import functions as F

    dynamic = tables.dynamic
    batch = day_frame(dynamic, tables.day, rows, 2)
    day = F.lit(data.partition_key(tables.day))
    current = dynamic.table(tables.raw_merged).where(F.col("day") == day)
    kept = current.drop("day").join(batch.select("trip_id"), "trip_id", "left_anti")
    _with_day(kept.unionByName(batch)).write.insertInto(tables.raw_merged, overwrite=True)


def cpu_clock(spark: Any) -> Callable[[], float]:
    """CPU seconds of this process and of the session's JVM, which does Spark's work.

    On a shared machine, CPU time moves less with other people's load than wall time does.
    """
    pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    tick = os.sysconf("SC_CLK_TCK")
    stat = Path(f"/proc/{pid}/stat")

    def seconds() -> float:
        # utime and stime: fields 14 and 15, counted after the command's closing parenthesis.
        fields = stat.read_text().rsplit(")", 1)[1].split()
        return time.process_time() + (int(fields[11]) + int(fields[12])) / tick

    return seconds


def _share(guards: list[float], walls: list[float]) -> float:
    """The guards' median share of the timed publishes (the warm-up round's guards come first)."""
    timed = sorted(guards[-len(walls) :])
    return timed[len(timed) // 2] / max(sorted(walls)[len(walls) // 2], 1e-9)


def run(scale: Scale, repeat: int | None, workdir: Path) -> list[Line]:
    """Our overwrite and merge against raw Spark's, with the guards' share."""
    import idem_assets as ia
    from idem_assets.lib.backends.spark.backend import SparkBackend

    rows, rounds, other_days = SIZES[scale]
    spark = _session(workdir)
    spark.sql(f"CREATE DATABASE IF NOT EXISTS bench LOCATION '{workdir.resolve() / 'bench.db'}'")
    backend = SparkBackend(spark)
    day = other_days
    guards: list[float] = []

    def ours(mode: str, table: str, version: int) -> None:
        named = settings(mode, table)
        batch = backend.evaluate(day_frame(spark, day, rows, version), named)
        started = time.perf_counter()

        def on_stage(stage: str) -> None:
            if stage == "guards_passed":
                guards.append(time.perf_counter() - started)

        ia.publish(backend, batch, named, data.window([day]), now=data.NOW, on_stage=on_stage)

    tables = build_tables(spark, backend, rows, other_days)

    def raw_overwrite_day() -> None:
        raw_overwrite(tables, rows)

    def raw_merge_day() -> None:
        raw_merge(tables, rows)

    names = ["publish (Spark)", "raw insertInto, dynamic"]
    clock = cpu_clock(spark)
    times = interleave(
        [Case(names[0], lambda: ours("overwrite", "ours", 1)), Case(names[1], raw_overwrite_day)],
        repeat or rounds,
        cpu_clock=clock,
    )
    share = _share(guards, times[names[0]].wall)
    guards.clear()
    merge_names = ["publish merge (Spark)", "raw DataFrame merge"]
    merge_times = interleave(
        [
            Case(merge_names[0], lambda: ours("merge", "ours_merge", 2)),
            Case(merge_names[1], raw_merge_day),
        ],
        repeat or rounds,
        cpu_clock=clock,
    )
    merge_share = _share(guards, merge_times[merge_names[0]].wall)
    # The same rows, not just as many: a count and an order-free sum of row hashes per table.
    content = {
        t: tuple(
            spark.sql(
                f"SELECT count(*), sum(hash(trip_id, pickup_at, fare)) FROM bench.{t}"
            ).first()
        )
        for t in ("ours", "raw", "ours_merge", "raw_merge")
    }
    equal = content["ours"] == content["raw"] and content["ours_merge"] == content["raw_merge"]
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    label = f"{rows / 1e6:g}M rows" if rows >= 1_000_000 else f"{rows // 1_000}k rows"
    return [
        line_from_times(
            "10 Spark overwrite",
            label,
            times,
            names[0],
            names[1],
            target=("<=", 1.3),
            equal=equal,
            notes=[
                f"one day built in Spark replaced in a table of {other_days + 1} days; raw:"
                " insertInto(overwrite=True) in dynamic mode (a child session's setting);"
                f" guards' share of ours: {share:.0%}; load average at the end: {load}"
            ],
        ),
        line_from_times(
            "10 Spark merge",
            label,
            merge_times,
            merge_names[0],
            merge_names[1],
            target=("<=", 1.3),
            equal=equal,
            notes=[
                "the day's stored rows whose key the batch lacks, plus the batch, written back"
                " as the day's partition; raw: the same anti join and union, insertInto in"
                f" dynamic mode; guards' share of ours: {merge_share:.0%}"
            ],
        ),
    ]
