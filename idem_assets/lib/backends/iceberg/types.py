"""Iceberg's types: what a new Iceberg table stores for an Arrow type, and what reads back.

Iceberg (format version 2, as pyiceberg 0.12 writes it) has microsecond timestamps only, naive
(``timestamp``) or an instant in UTC (``timestamptz``), 32- and 64-bit signed integers, one string
and one binary type, and no unsigned integers: :meth:`IcebergTypes.stored_type` is the type a
batch column is cast to before the guards judge it, which is exactly the type a scan returns, so
a fingerprint taken on the staged batch equals one taken on the stored rows. Statements a
refusal prints are Spark SQL, as Delta's are (Spark is where Iceberg tables are altered).
"""

import pyarrow as pa
from pyiceberg.schema import Schema

from idem_assets.lib.backends.delta.types import DeltaTypes

_WIDER = {
    # Iceberg's smallest integer is int: int8 and int16 read back as int32.
    pa.int8(): pa.int32(),
    pa.int16(): pa.int32(),
    pa.uint8(): pa.int32(),
    pa.uint16(): pa.int32(),
    pa.uint32(): pa.int64(),
    # The only Iceberg type that holds every uint64.
    pa.uint64(): pa.decimal128(20, 0),
    pa.float16(): pa.float32(),
    pa.date64(): pa.date32(),
    pa.time32("s"): pa.time64("us"),
    pa.time32("ms"): pa.time64("us"),
    pa.time64("ns"): pa.time64("us"),
    pa.large_string(): pa.string(),
    pa.string_view(): pa.string(),
    pa.large_binary(): pa.binary(),
    pa.binary_view(): pa.binary(),
}


#: Spark SQL's spellings, which Delta's tables share with Iceberg's (statements a user runs in
#: Spark); only the names are borrowed, never Delta's migrations.
_SPARK = DeltaTypes("")


class IcebergTypes:
    """Iceberg's :class:`~idem_assets.lib.write.schema_fit.TypeDialect` (Spark SQL spellings)."""

    engine = "Iceberg"

    def stored_type(self, batch_type: pa.DataType) -> pa.DataType:
        """Microsecond timestamps (aware ones in UTC), int32 or int64, one string width."""
        if pa.types.is_dictionary(batch_type):
            return self.stored_type(batch_type.value_type)
        if pa.types.is_timestamp(batch_type):
            return pa.timestamp("us", tz="UTC" if batch_type.tz is not None else None)
        if isinstance(batch_type, pa.Decimal256Type) and batch_type.precision <= 38:
            return pa.decimal128(batch_type.precision, batch_type.scale)
        return _WIDER.get(batch_type, batch_type)

    def type_sql(self, arrow_type: pa.DataType) -> str:
        """Spark SQL's name of ``arrow_type`` in an Iceberg table."""
        if pa.types.is_time(arrow_type):
            return "TIME"
        return _SPARK.type_sql(arrow_type)

    def sql_name(self, name: str) -> str:
        """``name`` as Spark SQL spells it: backticks only around a reserved word."""
        return _SPARK.sql_name(name)


ICEBERG_TYPES = IcebergTypes()


def arrow_columns(schema: Schema) -> dict[str, pa.DataType]:
    """The table's columns as the Arrow types a scan returns (one string and binary width)."""
    found = {}
    for field in schema.as_arrow():
        found[field.name] = ICEBERG_TYPES.stored_type(field.type)
    return found


def promotable(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether Iceberg's schema evolution changes a column of ``old`` to ``new`` in place.

    Iceberg promotes int to long, float to double and a decimal to more digits of one scale;
    any other change rewrites the column, which no commit of a publish does.
    """
    if old == pa.int32() and new == pa.int64():
        return True
    if old == pa.float32() and new == pa.float64():
        return True
    return (
        pa.types.is_decimal(old)
        and pa.types.is_decimal(new)
        and old.scale == new.scale
        and new.precision >= old.precision
        and new.precision <= 38
    )
