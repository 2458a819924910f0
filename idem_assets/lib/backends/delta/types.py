"""Delta Lake's types: what a new Delta table stores for an Arrow type, and how a fix changes one.

Delta has one timestamp unit (microseconds), naive (``TIMESTAMP_NTZ``) or an instant
(``TIMESTAMP``, kept in UTC), no unsigned integers and one width of strings. Types are named in
messages as Delta's SQL names them; the migrations a refusal prints are deltalake's Python API,
which delta-rs runs (its SQL has no ``ALTER TABLE``): a column added in a metadata commit, any
other change as one rewrite of the table that keeps its name, partitioning and properties.
"""

from collections.abc import Mapping, Sequence

import pyarrow as pa

from idem_assets.lib.write.schema_fit import PARQUET_WIDENINGS

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


#: Delta's names of the primitive types ``alter.add_columns`` takes by name.
_FIELD_TYPES = {
    pa.bool_(): "boolean",
    pa.int8(): "byte",
    pa.int16(): "short",
    pa.int32(): "integer",
    pa.int64(): "long",
    pa.float32(): "float",
    pa.float64(): "double",
    pa.string(): "string",
    pa.binary(): "binary",
    pa.date32(): "date",
}
#: Arrow's constructors of those types, as Python spells them.
_ARROW_CODE = {
    pa.bool_(): "bool_",
    pa.int8(): "int8",
    pa.int16(): "int16",
    pa.int32(): "int32",
    pa.int64(): "int64",
    pa.float32(): "float32",
    pa.float64(): "float64",
    pa.string(): "string",
    pa.binary(): "binary",
    pa.date32(): "date32",
}


class DeltaTypes:
    """The :class:`~idem_assets.lib.schema_fit.TypeDialect` of Delta Lake, for table ``uri``."""

    engine = "Delta Lake"

    def __init__(self, uri: str) -> None:
        """``uri`` is the table a printed migration changes."""
        self.uri = uri

    def stored_type(self, batch_type: pa.DataType) -> pa.DataType:
        """Microsecond timestamps (aware ones in UTC), signed integers, one string width."""
        if pa.types.is_dictionary(batch_type):
            return self.stored_type(batch_type.value_type)
        if pa.types.is_timestamp(batch_type):
            return pa.timestamp("us", tz="UTC" if batch_type.tz is not None else None)
        return PARQUET_WIDENINGS.get(batch_type, batch_type)

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

    def migration(
        self,
        missing: Sequence[str],
        extra: Mapping[str, pa.DataType],
        changed: Mapping[str, pa.DataType],
    ) -> str:
        """Deltalake code that drops ``missing``, adds ``extra`` and retypes ``changed`` columns."""
        table = f"deltalake.DeltaTable({self.uri!r})"
        names = [_field_type(t) for t in extra.values()]
        if not missing and not changed and all(names):
            fields = ", ".join(
                f"deltalake.Field({c!r}, {n!r})" for c, n in zip(extra, names, strict=True)
            )
            return f"{table}.alter.add_columns([{fields}])"
        steps = [f"import deltalake, pyarrow; t = {table}; d = t.to_pyarrow_table()"]
        if missing:
            steps.append(f"d = d.drop_columns({list(missing)!r})")
        for column, new in changed.items():
            steps.append(
                f"d = d.set_column(d.schema.get_field_index({column!r}), {column!r},"
                f" d[{column!r}].cast({arrow_code(new)}))"
            )
        for column, new in extra.items():
            steps.append(
                f"d = d.append_column(pyarrow.field({column!r}, {arrow_code(new)}),"
                f" pyarrow.nulls(len(d), {arrow_code(new)}))"
            )
        steps.append("deltalake.write_deltalake(t, d, mode='overwrite', schema_mode='overwrite')")
        return "; ".join(steps)


def _field_type(arrow_type: pa.DataType) -> str | None:
    """Delta's name of ``arrow_type`` for ``alter.add_columns``, ``None`` for a nested type."""
    if pa.types.is_timestamp(arrow_type):
        return "timestamp" if arrow_type.tz is not None else "timestamp_ntz"
    if pa.types.is_decimal(arrow_type):
        return f"decimal({arrow_type.precision},{arrow_type.scale})"
    return _FIELD_TYPES.get(arrow_type)


def arrow_code(arrow_type: pa.DataType) -> str:
    """Python that builds ``arrow_type`` (``pyarrow.float64()``)."""
    t = arrow_type
    if pa.types.is_timestamp(t):
        return f"pyarrow.timestamp({t.unit!r}" + (f", tz={t.tz!r})" if t.tz else ")")
    if pa.types.is_decimal(t):
        return f"pyarrow.decimal128({t.precision}, {t.scale})"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"pyarrow.list_({arrow_code(t.value_type)})"
    if pa.types.is_struct(t):
        fields = ", ".join(f"({f.name!r}, {arrow_code(f.type)})" for f in t)
        return f"pyarrow.struct([{fields}])"
    if t in _ARROW_CODE:
        return f"pyarrow.{_ARROW_CODE[t]}()"
    return f"pyarrow.type_for_alias({str(t)!r})"
