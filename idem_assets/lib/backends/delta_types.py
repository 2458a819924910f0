"""Delta Lake's types: what a new Delta table stores for an Arrow type, and how Delta SQL spells it.

Delta has one timestamp unit (microseconds), naive (``TIMESTAMP_NTZ``) or an instant
(``TIMESTAMP``, kept in UTC), no unsigned integers and one width of strings; the statements a
refusal prints are Delta's SQL (Spark, Databricks), where names are quoted with backticks.
"""

import pyarrow as pa

_WIDER = {
    pa.uint8(): pa.int16(),
    pa.uint16(): pa.int32(),
    pa.uint32(): pa.int64(),
    # The only Delta type that holds every uint64.
    pa.uint64(): pa.decimal128(20, 0),
    pa.float16(): pa.float32(),
    pa.date64(): pa.date32(),
    pa.large_string(): pa.string(),
    pa.string_view(): pa.string(),
    pa.large_binary(): pa.binary(),
    pa.binary_view(): pa.binary(),
}
_NAMES = {
    pa.bool_(): "BOOLEAN",
    pa.int8(): "TINYINT",
    pa.int16(): "SMALLINT",
    pa.int32(): "INT",
    pa.int64(): "BIGINT",
    pa.float32(): "FLOAT",
    pa.float64(): "DOUBLE",
    pa.string(): "STRING",
    pa.binary(): "BINARY",
    pa.date32(): "DATE",
}
#: Words Delta's SQL reserves, so a column of that name is quoted in a printed statement.
_RESERVED = frozenset(
    "all and any as between by case cast create cross current_date current_timestamp date"
    " delete distinct else end except false from full group having in inner insert intersect"
    " interval into is join left like limit not null on or order outer right select table"
    " then time timestamp to true union update user using values when where with".split()
)


class DeltaTypes:
    """The :class:`~idem_assets.lib.schema_fit.TypeDialect` of Delta Lake."""

    engine = "Delta Lake"

    def stored_type(self, batch_type: pa.DataType) -> pa.DataType:
        """Microsecond timestamps (aware ones in UTC), signed integers, one string width."""
        if pa.types.is_dictionary(batch_type):
            return self.stored_type(batch_type.value_type)
        if pa.types.is_timestamp(batch_type):
            return pa.timestamp("us", tz="UTC" if batch_type.tz is not None else None)
        return _WIDER.get(batch_type, batch_type)

    def type_sql(self, arrow_type: pa.DataType) -> str:
        """Delta SQL's name of ``arrow_type``."""
        if pa.types.is_timestamp(arrow_type):
            return "TIMESTAMP" if arrow_type.tz is not None else "TIMESTAMP_NTZ"
        if pa.types.is_decimal(arrow_type):
            return f"DECIMAL({arrow_type.precision},{arrow_type.scale})"
        return _NAMES.get(arrow_type, str(arrow_type).upper())

    def sql_name(self, name: str) -> str:
        """``name`` as Delta SQL spells it: backticks only around a reserved word."""
        return f"`{name}`" if name.lower() in _RESERVED else name


DELTA_TYPES = DeltaTypes()
