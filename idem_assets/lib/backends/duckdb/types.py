"""DuckDB's side of the schema fit: its type names, the types a new table stores, its keywords.

The decisions are :mod:`idem_assets.lib.write.schema_fit`'s, on Arrow types. DuckDB itself
translates between its type names and Arrow's (in a private in-memory connection, once per type),
so this module never parses a type name.
"""

import functools
import threading

import duckdb
import pyarrow as pa

from idem_assets.lib.model.identifiers import quote

#: The type a new table stores: pandas hands DuckDB nanosecond timestamps; store microseconds,
#: DuckDB's native precision, so later Arrow batches and SQL literals compare without casts.
_NATIVE = {
    "TIMESTAMP_S": "TIMESTAMP",
    "TIMESTAMP_MS": "TIMESTAMP",
    "TIMESTAMP_NS": "TIMESTAMP",
    # DuckDB 2 reads a pandas tz-aware column (nanoseconds) as TIMESTAMPTZ_NS.
    "TIMESTAMPTZ_NS": "TIMESTAMP WITH TIME ZONE",
}
_OTHER_UNITS = {"TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP_NS"}
_lock = threading.Lock()


@functools.cache
def _types_connection() -> duckdb.DuckDBPyConnection:
    return duckdb.connect()


@functools.cache
def duckdb_type(arrow_type: pa.DataType) -> str:
    """DuckDB's name for the type it reads an Arrow column of ``arrow_type`` as."""
    with _lock:
        conn = _types_connection()
        conn.register("idem-types", pa.table({"c": pa.array([], arrow_type)}))
        try:
            return conn.execute('DESCRIBE SELECT * FROM "idem-types"').fetchall()[0][1]
        finally:
            conn.unregister("idem-types")


@functools.cache
def arrow_type(column_type: str) -> pa.DataType:
    """The Arrow type DuckDB hands out for a column of DuckDB type ``column_type``."""
    with _lock:
        # column_type comes from DuckDB's own catalog, never from a batch or a user.
        relation = _types_connection().sql(f"SELECT CAST(NULL AS {column_type}) AS c LIMIT 0")
        return relation.to_arrow_table().schema.field(0).type


@functools.cache
def _reserved_words() -> frozenset[str]:
    with _lock:
        rows = (
            _types_connection()
            .execute(
                "SELECT keyword_name FROM duckdb_keywords() WHERE keyword_category = 'reserved'"
            )
            .fetchall()
        )
    return frozenset(r[0].lower() for r in rows)


def native(column_type: str) -> str:
    """The DuckDB type a new table stores for a batch column DuckDB reads as ``column_type``."""
    return _NATIVE.get(column_type, column_type)


def cast_sql(expression: str, batch_type: str, stored_type: str) -> str:
    """SQL that casts ``expression`` from DuckDB type ``batch_type`` to ``stored_type``."""
    if batch_type == stored_type:
        return expression
    if batch_type in _OTHER_UNITS and "TIMESTAMP" not in (batch_type, stored_type):
        # DuckDB casts between seconds, milliseconds and nanoseconds only through microseconds.
        expression = f"CAST({expression} AS TIMESTAMP)"
    return f"CAST({expression} AS {stored_type})"


class DuckDBTypes:
    """The :class:`~idem_assets.lib.schema_fit.TypeDialect` of DuckDB."""

    engine = "DuckDB"

    def stored_type(self, batch_type: pa.DataType) -> pa.DataType:
        """What DuckDB reads the column as, with timestamps in microseconds."""
        if pa.types.is_null(batch_type):
            return batch_type
        return arrow_type(native(duckdb_type(batch_type)))

    def type_sql(self, arrow_type: pa.DataType) -> str:
        """DuckDB's name for the type, as ``CREATE TABLE`` takes it."""
        return duckdb_type(arrow_type)

    def sql_name(self, name: str) -> str:
        """``name`` as a statement for the user to run spells it: quoted only where it must be."""
        return quote(name) if name.lower() in _reserved_words() else name


DUCKDB_TYPES = DuckDBTypes()
