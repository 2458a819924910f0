"""PostgreSQL's column types in Arrow terms: what a new table stores, and how to spell it.

The schema fit decides on Arrow types; this dialect says which Arrow type each Postgres column
type reads back as, which type a new column of a batch type is stored in, and the SQL that
creates it. Every stored type is one the ADBC driver's binary COPY writes and reads without loss.
"""

import re

import pyarrow as pa

from idem_assets.lib.model.errors import SchemaMismatchError
from idem_assets.lib.model.identifiers import quote

_PLAIN = re.compile(r"[a-z_][a-z0-9_]*")
#: Words Postgres reserves (its keywords of category R, and those usable only as types or
#: function names, which a column name cannot be either without quotes).
_RESERVED = frozenset(
    """all analyse analyze and any array as asc asymmetric authorization binary both case cast
    check collate collation column concurrently constraint create cross current_catalog
    current_date current_role current_schema current_time current_timestamp current_user default
    deferrable desc distinct do else end except false fetch for foreign freeze from full grant
    group having ilike in initially inner intersect into is isnull join lateral leading left like
    limit localtime localtimestamp natural not notnull null offset on only or order outer
    overlaps placing primary references returning right select session_user similar some
    symmetric system_user table tablesample then to trailing true union unique user using
    variadic verbose when where window with""".split()
)
_NUMERIC = re.compile(r"numeric\((\d+),(\d+)\)")
_FROM_POSTGRES: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "smallint": pa.int16(),
    "integer": pa.int32(),
    "bigint": pa.int64(),
    "real": pa.float32(),
    "double precision": pa.float64(),
    "text": pa.string(),
    "bytea": pa.binary(),
    "date": pa.date32(),
    "timestamp without time zone": pa.timestamp("us"),
    "timestamp with time zone": pa.timestamp("us", tz="UTC"),
    "time without time zone": pa.time64("us"),
}


class PostgresTypes:
    """The schema fit's dialect for PostgreSQL."""

    engine = "Postgres"
    #: The bytes of a name PostgreSQL keeps (NAMEDATALEN - 1); it drops the rest silently.
    name_bytes = 63

    def stored_type(self, batch_type: pa.DataType) -> pa.DataType:
        """The Arrow type a new column of ``batch_type`` reads back as once stored."""
        t = batch_type
        if pa.types.is_dictionary(t):
            # A pandas categorical: stored as its values.
            return self.stored_type(t.value_type)
        if pa.types.is_boolean(t) or t in (pa.int16(), pa.int32(), pa.int64()):
            return t
        if t in (pa.int8(), pa.uint8()):
            return pa.int16()
        if t == pa.uint16():
            return pa.int32()
        if t == pa.uint32():
            return pa.int64()
        if t == pa.uint64():
            return pa.decimal128(20, 0)
        if pa.types.is_floating(t):
            return pa.float32() if t in (pa.float16(), pa.float32()) else pa.float64()
        if pa.types.is_decimal(t):
            return t
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
            return pa.string()
        if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
            return pa.binary()
        if pa.types.is_date(t):
            return pa.date32()
        if pa.types.is_timestamp(t):
            # Postgres stores microseconds; an aware value is stored as the instant it names.
            return pa.timestamp("us", tz="UTC" if t.tz is not None else None)
        if pa.types.is_time(t):
            return pa.time64("us")
        if pa.types.is_null(t):
            return t
        raise _unsupported(str(t))

    def type_sql(self, arrow_type: pa.DataType) -> str:
        """The Postgres type that stores ``arrow_type``, e.g. ``bigint`` for int64 or uint32."""
        t = self.stored_type(arrow_type)
        if pa.types.is_decimal(t):
            return f"numeric({t.precision},{t.scale})"
        if pa.types.is_timestamp(t):
            return "timestamp with time zone" if t.tz is not None else "timestamp"
        for sql, arrow in _FROM_POSTGRES.items():
            if arrow == t:
                return sql
        raise _unsupported(str(t))

    def sql_name(self, name: str) -> str:
        """``name`` as a statement for the user to run spells it: quoted only where it must be."""
        # Postgres folds unquoted names to lower case, so any other spelling needs quotes.
        return name if _PLAIN.fullmatch(name) and name not in _RESERVED else quote(name)


def arrow_type(column_type: str) -> pa.DataType | None:
    """The Arrow type a Postgres column of ``column_type`` (``format_type``) reads back as."""
    match = _NUMERIC.fullmatch(column_type)
    if match:
        precision, scale = int(match[1]), int(match[2])
        return (pa.decimal128 if precision <= 38 else pa.decimal256)(precision, scale)
    if column_type.startswith(("character varying", "character(")):
        return pa.string()
    # timestamp(3) and time(0) keep their precision; Arrow reads them back as microseconds.
    plain = re.sub(r"\(\d+\)", "", column_type)
    return _FROM_POSTGRES.get(plain)


_TIMESTAMP = re.compile(r"timestamp(?:\((\d)\))? with(?:out)? time zone")


def timestamp_digits(column_type: str) -> int | None:
    """The fractional second digits a ``timestamp(n)`` column keeps (6 without ``n``)."""
    found = _TIMESTAMP.fullmatch(column_type)
    if found is None:
        return None
    return int(found[1]) if found[1] is not None else 6


_LENGTH = re.compile(r"(?:character varying|character)\((\d+)\)")


def text_lengths(columns: dict[str, str]) -> dict[str, tuple[int, str]]:
    """The characters each ``varchar(n)`` or ``char(n)`` column holds, with its type."""
    found = {name: _LENGTH.fullmatch(kind) for name, kind in columns.items()}
    return {name: (int(m[1]), columns[name]) for name, m in found.items() if m}


def _unsupported(type_name: str) -> SchemaMismatchError:
    return SchemaMismatchError(
        f"Refused: a column of type {type_name} has no PostgreSQL type the binary COPY stores"
        " without loss. Nothing was changed. Fix: convert the column to a number, text, date,"
        " timestamp or boolean before returning the batch, e.g. df['c'] = df['c'].astype(str)."
    )
