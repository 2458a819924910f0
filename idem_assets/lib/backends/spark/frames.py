"""A Spark DataFrame as the publish takes it: evaluated once, into Parquet, with a probe in Arrow.

The frame is evaluated exactly once, by the job that writes it, as sent, into a fresh version
directory of its table (:func:`spark_batch`): that copy is what the staged batch, every guard and
the write read, so they see the same rows even when the frame is not deterministic (``rand()``,
a source that changes while the publish runs). The same job observes what the checks before
staging need (:func:`probe_metrics`): each column's smallest and largest value and, for text, the
values the run-time check looks for (a uuid of version 1 or 4, bare 32-digit hex), so each of
them decides on the probe as on the whole batch; the batch's row count and hash sum, its
fingerprint once written; and the rows with a NULL partition value or key, which the guards
would otherwise count in a job of their own. The batch never reaches the driver.
"""

import operator
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql import types as T

from idem_assets.lib.backends.spark import catalog
from idem_assets.lib.backends.spark.sql import DAY
from idem_assets.lib.backends.spark.types import arrow_type
from idem_assets.lib.model.errors import SchemaMismatchError
from idem_assets.lib.write.runtime_values import _HEX32, _RANDOM_HEX, _RANDOM_UUID
from idem_assets.lib.write.seam import EngineBatch

_ORDERED = (T.NumericType, T.DateType, T.TimestampType, T.TimestampNTZType, T.StringType)
#: Bare-hex values a probe keeps: the run-time check needs four to call a column uuid4().hex.
_HEX_SAMPLE = 4
#: How long the driver waits for the metrics of a finished job to reach its listener.
_METRICS_WAIT_S = 30.0


@dataclass
class SparkFrame:
    """A DataFrame evaluated once: its rows as sent under ``location``, and what the job saw."""

    spark: Any
    location: str
    #: The batch's columns as sent.
    schema: T.StructType
    #: The partition columns ``location`` is laid out by (:data:`DAY` and batch columns).
    layout: tuple[str, ...]
    rows: int
    #: Row count and hash sum of the batch over its columns sorted by name (``sql.fingerprint``).
    fingerprint: tuple[int, int]
    #: Each ordered column's smallest and largest value, ``None`` for a column of no value.
    bounds: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    #: Rows with NULL in any of a group of columns, per group the job was asked to count.
    nulls: dict[tuple[str, ...], int] = field(default_factory=dict)
    #: Set once a commit made ``location`` the table's: it is no longer this batch's to delete.
    committed: bool = False

    @property
    def struct(self) -> T.StructType:
        """How ``location`` is read: the data columns, then the layout's (as Spark stores them)."""
        by_name = {f.name: f for f in self.schema}
        data = [f for f in self.schema if f.name not in self.layout]
        parts = [by_name.get(c) or T.StructField(c, T.DateType(), True) for c in self.layout]
        return T.StructType([*data, *parts])

    def read(self) -> DataFrame:
        """The batch as sent, read back from ``location`` (a lazy DataFrame)."""
        stored = self.spark.read.schema(self.struct).format("parquet").load(self.location)
        return stored.select(*[F.col(f"`{f.name}`") for f in self.schema])

    def discard(self) -> None:
        """Delete the evaluated copy, unless a commit made it the table's."""
        if not self.committed:
            catalog.remove(self.spark, self.location)


def day_of(column: str, kind: pa.DataType) -> Column:
    """The UTC day of a timestamp column, as Spark computes it whatever the session's zone."""
    if kind.tz is None:
        return F.to_date(F.col(f"`{column}`"))
    micros = F.unix_micros(F.col(f"`{column}`"))
    return F.date_from_unix_date(F.floor(micros / 86_400_000_000).cast("int"))


def arrow_schema(frame: DataFrame, asset: str) -> pa.Schema:
    """The frame's columns as Arrow types; a column Arrow cannot hold is refused by name."""
    types: dict[str, pa.DataType] = {}
    for f in frame.schema:
        found = arrow_type(f.dataType)
        if found is None:
            raise SchemaMismatchError(
                f"Refused to write asset '{asset}': column '{f.name}' is of Spark type"
                f" {f.dataType.simpleString()}, which has no Arrow type, so its values cannot be"
                " checked. Nothing was changed. Fix: cast it to a type Arrow holds (e.g."
                f" df.withColumn('{f.name}', df['{f.name}'].cast('string')))."
            )
        types[f.name] = found
    return pa.schema([pa.field(n, t) for n, t in types.items()])


def spark_batch(
    frame: DataFrame,
    asset: str,
    location: str,
    layout: tuple[str, ...],
    time_column: str | None,
    nulls: Sequence[tuple[str, ...]] = (),
) -> EngineBatch:
    """``frame`` evaluated once, by the job writing it as sent into ``location``, with its probe.

    ``layout`` names the batch columns (and :data:`DAY`, the UTC day of ``time_column``) the
    copy is partitioned by: the table's, so the copy can become the table's partitions as is.
    The same job counts the rows with NULL in any column of each group of ``nulls`` (the
    partition columns, the key), which the guards would otherwise scan the copy for.
    """
    schema = arrow_schema(frame, asset)
    metrics = probe_metrics(frame.schema, nulls)
    observation = Observation(f"idem_probe_{uuid.uuid4().hex}")
    out = frame.observe(observation, *metrics)
    if DAY in layout:
        assert time_column is not None
        out = out.withColumn(DAY, day_of(time_column, schema.field(time_column).type))
    writer = out.write.mode("errorifexists").format("parquet")
    if layout:
        writer = writer.partitionBy(*layout)
    spark = frame.sparkSession
    evaluated = SparkFrame(spark, location, frame.schema, layout, 0, (0, 0))
    try:
        writer.save(location)
        # An empty batch writes no file: the directory must still be there to be read.
        catalog.make_directory(spark, location)
        values = observed(observation)
        if values is None:
            # The listener never delivered them: the evaluated copy holds the same rows.
            values = list(evaluated.read().agg(*metrics).first() or ())
    except BaseException:
        evaluated.discard()
        raise
    counted = len(values) - len(nulls)
    probe, bounds = _probe(frame.schema, schema, values[:counted])
    evaluated.fingerprint = fingerprint(values[counted - FINGERPRINT_METRICS : counted])
    evaluated.rows = evaluated.fingerprint[0]
    evaluated.bounds = bounds
    evaluated.nulls = {group: int(n) for group, n in zip(nulls, values[counted:], strict=True)}
    return EngineBatch(frame=evaluated, probe=probe)


def probe_metrics(schema: T.StructType, nulls: Sequence[tuple[str, ...]] = ()) -> list[Column]:
    """The aggregates of one pass: the probe's, the row count and hash sum, the NULL counts.

    A NULL count per group of ``nulls``: the rows with NULL in any of its columns. Per ordered
    column its minimum and maximum; per text column one canonical uuid, the count
    of uuid-like bare hex values and four of them, and one bare hex value that is no uuid.
    """
    found: list[Column] = []
    for f in schema:
        c = F.col(f"`{f.name}`")
        if isinstance(f.dataType, _ORDERED):
            found += [F.min(c), F.max(c)]
        if isinstance(f.dataType, T.StringType):
            hexed = c.rlike(_HEX32)
            random = F.when(hexed & c.rlike(_RANDOM_HEX), c)
            found += [
                F.min(F.when(c.rlike(_RANDOM_UUID), c)),
                F.count(random),
                F.min(random),
                F.max(random),
                F.first(random, ignorenulls=True),
                F.last(random, ignorenulls=True),
                F.min(F.when(hexed & ~c.rlike(_RANDOM_HEX), c)),
            ]
    # count(CASE ...), not count_if: Spark rewrites count_if into a projection under the
    # observation, which moves a limit of the frame above its UDFs (they then see every row).
    counts = [F.count(F.when(_any_null(group), F.lit(1))) for group in nulls]
    return numbered([*found, *fingerprint_metrics([f.name for f in schema]), *counts])


def _any_null(names: Sequence[str]) -> Column:
    return reduce(operator.or_, [F.col(f"`{n}`").isNull() for n in names])


#: Bits of each slice of a row's 64-bit hash that :func:`fingerprint_metrics` sums apart.
_SLICE_BITS = 21
#: The values :func:`fingerprint_metrics` observes: the row count and three slice sums.
FINGERPRINT_METRICS = 4


def fingerprint_metrics(names: Sequence[str]) -> list[Column]:
    """Row count and the hash sum's slices over ``names`` sorted (:func:`fingerprint` adds them).

    Spark 4 runs in ANSI mode, so a BIGINT sum of whole hashes overflows; a DECIMAL(38, 0) sum
    holds it (:func:`~.sql.fingerprint`) but cost the evaluating job about 130 ms of CPU per
    million rows more. Each 21-bit slice sums as BIGINT without overflow below 2^42 rows, and
    the slices add up to the same sum.
    """
    ordered = [F.col(f"`{n}`") for n in sorted(names)]
    hashed = F.xxhash64(*ordered) if ordered else F.lit(0).cast("bigint")
    mask = F.lit((1 << _SLICE_BITS) - 1)
    top = F.shiftright(hashed, 2 * _SLICE_BITS)
    middle = F.shiftright(hashed, _SLICE_BITS).bitwiseAND(mask)
    slices = [top, middle, hashed.bitwiseAND(mask)]
    return [F.count(F.lit(1)), *[F.coalesce(F.sum(s), F.lit(0)) for s in slices]]


def fingerprint(values: Sequence[Any]) -> tuple[int, int]:
    """Row count and hash sum from :func:`fingerprint_metrics`' values, in order."""
    count, top, middle, low = (int(v or 0) for v in values)
    return count, (top << 2 * _SLICE_BITS) + (middle << _SLICE_BITS) + low


def numbered(metrics: Sequence[Column]) -> list[Column]:
    """``metrics`` named in order (``m0``, ``m1``, ...), as :func:`observed` returns them."""
    return [m.alias(f"m{i}") for i, m in enumerate(metrics)]


def observed(observation: Observation) -> list[Any] | None:
    """The metrics a finished job observed, in order; ``None`` if they did not arrive in time.

    A job's metrics reach the driver through a listener, after the job returns.
    """
    future = observation._jo.future()  # type: ignore[union-attr]
    deadline = time.monotonic() + _METRICS_WAIT_S
    while not future.isCompleted():
        if time.monotonic() > deadline:
            return None
        time.sleep(0.005)
    got = observation.get
    return [got[f"m{i}"] for i in range(len(got))]


def _probe(
    fields: T.StructType, schema: pa.Schema, values: list[Any]
) -> tuple[pa.Table, dict[str, tuple[Any, Any]]]:
    """The probe and each ordered column's bounds, from :func:`probe_metrics`' values."""
    columns: dict[str, list[object]] = {n: [] for n in schema.names}
    bounds: dict[str, tuple[Any, Any]] = {}
    it = iter(values)
    for f in fields:
        if isinstance(f.dataType, _ORDERED):
            lo, hi = next(it), next(it)
            columns[f.name] += [lo, hi]
            bounds[f.name] = (lo, hi)
        if isinstance(f.dataType, T.StringType):
            canonical, random, low, high, first, last, other = (next(it) for _ in range(7))
            if canonical is not None:
                columns[f.name].append(canonical)
            else:
                columns[f.name] += [low, high, first, last][: min(int(random), _HEX_SAMPLE)]
                columns[f.name] += [other] if other is not None else []
    height = max((len(v) for v in columns.values()), default=0)
    padded = {n: v + [None] * (height - len(v)) for n, v in columns.items()}
    probe = pa.table(
        {n: pa.array(padded[n], schema.field(n).type) for n in schema.names}, schema=schema
    )
    return probe, bounds
