"""A Spark DataFrame as the publish takes it: the frame, and a probe of its values in Arrow.

The probe holds, for each column, its smallest and largest value and, for text, the values the
run-time check looks for (a uuid of version 1 or 4, bare 32-digit hex): the checks that run
before staging decide on it exactly as on the whole batch. It is computed by Spark (one
aggregation, and a bounded query per text column); the batch never reaches the driver.

The frame is evaluated once, into a local checkpoint on the executors, before the probe: the
probe, the staged copy and so every guard read the same rows even when the frame is not
deterministic (``rand()``, a source that changes while the publish runs).
"""

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from idem_assets.lib.backends.spark.types import arrow_type
from idem_assets.lib.model.errors import SchemaMismatchError
from idem_assets.lib.write.runtime_values import _HEX32, _RANDOM_HEX, _RANDOM_UUID
from idem_assets.lib.write.seam import EngineBatch

_ORDERED = (T.NumericType, T.DateType, T.TimestampType, T.TimestampNTZType, T.StringType)
#: Bare-hex values a probe keeps: the run-time check needs four to call a column uuid4().hex.
_HEX_SAMPLE = 4


def spark_batch(frame: DataFrame, asset: str) -> EngineBatch:
    """``frame`` evaluated once, with its probe; a column Arrow cannot hold is refused by name."""
    fields = list(frame.schema)
    types: dict[str, pa.DataType] = {}
    for f in fields:
        found = arrow_type(f.dataType)
        if found is None:
            raise SchemaMismatchError(
                f"Refused to write asset '{asset}': column '{f.name}' is of Spark type"
                f" {f.dataType.simpleString()}, which has no Arrow type, so its values cannot be"
                " checked. Nothing was changed. Fix: cast it to a type Arrow holds (e.g."
                f" df.withColumn('{f.name}', df['{f.name}'].cast('string')))."
            )
        types[f.name] = found
    schema = pa.schema([pa.field(n, t) for n, t in types.items()])
    frame = frame.localCheckpoint(eager=True)
    ordered = [f.name for f in fields if isinstance(f.dataType, _ORDERED)]
    columns: dict[str, list[object]] = {n: [] for n in types}
    if ordered:
        aggregates = []
        for n in ordered:
            c = F.col(f"`{n}`")
            aggregates += [F.min(c), F.max(c)]
        extremes = frame.agg(*aggregates).collect()[0]
        for i, n in enumerate(ordered):
            columns[n] += [extremes[2 * i], extremes[2 * i + 1]]
    for f in fields:
        if isinstance(f.dataType, T.StringType):
            columns[f.name] += _uuid_like(frame, f.name)
    height = max((len(v) for v in columns.values()), default=0)
    padded = {n: v + [None] * (height - len(v)) for n, v in columns.items()}
    probe = pa.table({n: pa.array(padded[n], schema.field(n).type) for n in types}, schema=schema)
    return EngineBatch(frame=frame, probe=probe)


def _uuid_like(frame: DataFrame, name: str) -> list[object]:
    """A canonical uuid the column holds, and enough bare hex to decide as on every value."""
    c = F.col(f"`{name}`")
    canonical = frame.where(c.rlike(_RANDOM_UUID)).select(c).limit(1).collect()
    if canonical:
        return [canonical[0][0]]
    hexed = c.rlike(_HEX32)
    random = [
        r[0]
        for r in frame.where(hexed & c.rlike(_RANDOM_HEX)).select(c).limit(_HEX_SAMPLE).collect()
    ]
    other = [r[0] for r in frame.where(hexed & ~c.rlike(_RANDOM_HEX)).select(c).limit(1).collect()]
    return random + other
