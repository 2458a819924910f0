"""Spark's types: what a new Spark table stores for an Arrow type, and how statements spell it.

Spark keeps one timestamp unit (microseconds), naive (``TIMESTAMP_NTZ``) or an instant
(``TIMESTAMP``, shown in the session's time zone), no unsigned integers and one width of
strings. A Parquet table in Spark's catalog can gain columns (``ALTER TABLE ... ADD COLUMNS``)
but never change a column's type.
"""

import re

import pyarrow as pa
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_type, to_arrow_type

from idem_assets.lib.write.schema_fit import PARQUET_WIDENINGS

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SparkTypes:
    """The :class:`~idem_assets.lib.write.schema_fit.TypeDialect` of Spark SQL."""

    engine = "Spark"

    def stored_type(self, batch_type: pa.DataType) -> pa.DataType:
        """Microsecond timestamps (aware ones in UTC), signed integers, one string width."""
        if pa.types.is_dictionary(batch_type):
            return self.stored_type(batch_type.value_type)
        if pa.types.is_timestamp(batch_type):
            return pa.timestamp("us", tz="UTC" if batch_type.tz is not None else None)
        if pa.types.is_large_list(batch_type) or pa.types.is_list(batch_type):
            return pa.list_(self.stored_type(batch_type.value_type))
        return PARQUET_WIDENINGS.get(batch_type, batch_type)

    def type_sql(self, arrow_type: pa.DataType) -> str:
        """Spark SQL's name of ``arrow_type`` (``bigint``, ``timestamp_ntz``)."""
        return spark_type(arrow_type).simpleString()

    def sql_name(self, name: str) -> str:
        """``name`` as Spark SQL spells it: in backticks unless plain."""
        return name if _PLAIN.fullmatch(name) else "`" + name.replace("`", "``") + "`"


def spark_type(arrow_type: pa.DataType) -> T.DataType:
    """The Spark type that stores ``arrow_type`` (a naive timestamp as ``TIMESTAMP_NTZ``)."""
    if pa.types.is_timestamp(arrow_type) and arrow_type.tz is None:
        return T.TimestampNTZType()
    return from_arrow_type(arrow_type)


def arrow_type(spark: T.DataType) -> pa.DataType | None:
    """The Arrow type of a Spark column (``TIMESTAMP`` as UTC), ``None`` for one Arrow lacks."""
    try:
        found = to_arrow_type(spark, timezone="UTC")
    except Exception:
        return None
    if pa.types.is_timestamp(found) and found.tz is not None:
        return pa.timestamp("us", tz="UTC")
    return found


def spark_schema(schema: pa.Schema) -> T.StructType:
    """A Spark schema for Arrow ``schema`` (every field nullable, as a Parquet table's are)."""
    return T.StructType([T.StructField(f.name, spark_type(f.type), True) for f in schema])
