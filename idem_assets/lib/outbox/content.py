"""What an outbox action carries, as a fingerprint: equal for the same content, and only then.

A table's fingerprint is its row count and the sum of its row hashes, with its column names and
what each column's values mean folded in, so row order and column order do not change it, and
a doubled row, a renamed column or a DATE where there was an integer does. Text, bytes and
JSON-like data are fingerprinted by a hash of their bytes, so a large payload is never stored
whole.
"""

import datetime as dt
import decimal
import hashlib
import json
import re
import sys
import uuid
from collections.abc import Mapping
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from idem_assets.lib.dagster_layer.frames import to_arrow
from idem_assets.lib.model.errors import ConfigurationError
from idem_assets.lib.write.evaluator import embedded_database

#: A fingerprint as :func:`content_fingerprint` writes it: the row count, then 32 hex digits.
FINGERPRINT = re.compile(r"[0-9]+:[0-9a-f]{32}")

_WHAT = (
    "an outbox action's content must be a table (a pyarrow Table, a pandas or Polars"
    " DataFrame), text or bytes, or JSON-like data (dicts, lists, numbers, text, dates)"
)


def content_fingerprint(table: Any) -> str:
    """Order-independent fingerprint of a table's rows, column names and column kinds.

    ``table`` is a pyarrow Table or RecordBatch, or a pandas or Polars DataFrame.
    """
    arrow = _table_of(table)
    if arrow is None:
        raise ConfigurationError(
            f"content_fingerprint takes a table, got {type(table).__name__}. Fix: pass a"
            " pyarrow Table or a pandas or Polars DataFrame (Outbox.deliver also takes text,"
            " bytes and JSON-like data as content)."
        )
    count, values = _row_hashes(arrow)
    return _digest(count, values + _schema_hash(arrow.schema))


def fingerprints_of(content: Any) -> tuple[str, tuple[str, ...]]:
    """``(fingerprint, what earlier versions stored for the same content)`` of an action's content.

    Earlier versions fingerprinted a table by its values alone and stored a string as it was,
    so a ledger they wrote still recognises content it holds.
    """
    if isinstance(content, str):
        if FINGERPRINT.fullmatch(content):
            return content, ()
        return _hashed("text", content.encode()), (content,)
    if isinstance(content, bytes | bytearray | memoryview):
        return _hashed("bytes", bytes(content)), ()
    arrow = _table_of(content)
    if arrow is not None:
        count, values = _row_hashes(arrow)
        return _digest(count, values + _schema_hash(arrow.schema)), (_digest(count, values),)
    if content is None or isinstance(content, Mapping | list | tuple | bool | int | float):
        return _hashed("json", canonical_json(content).encode()), ()
    raise ConfigurationError(
        f"Refused to deliver: {_WHAT}; got {type(content).__name__}. Nothing was sent. Fix:"
        " pass the table the action carries, or the text or dict it sends."
    )


def canonical_json(value: Any) -> str:
    """``value`` as JSON with sorted keys: equal data gives equal text, whatever its key order."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_json_value
    )


def _json_value(value: Any) -> Any:
    """JSON for the values JSON lacks; a refusal for values with no one order (a set)."""
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID | dt.timedelta):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    item = getattr(value, "item", None)  # a numpy scalar
    if callable(item) and type(value).__module__ == "numpy":
        return item()
    if isinstance(value, set | frozenset):
        raise ConfigurationError(
            f"Refused to deliver: the content holds a set ({sorted(map(repr, value))[:3]}...),"
            " whose order differs from process to process, so it has no stable fingerprint."
            " Nothing was sent. Fix: pass sorted(the_set) instead."
        )
    raise ConfigurationError(
        f"Refused to deliver: the content holds a {type(value).__name__}, which has no JSON"
        f" form; {_WHAT}. Nothing was sent. Fix: convert it to text or a number first."
    )


def _table_of(content: Any) -> pa.Table | None:
    """``content`` as Arrow if it is a table of a kind the library stores, else ``None``."""
    pandas: Any = sys.modules.get("pandas")
    polars: Any = sys.modules.get("polars")
    tabular = isinstance(content, pa.Table | pa.RecordBatch)
    tabular |= pandas is not None and isinstance(content, pandas.DataFrame)
    tabular |= polars is not None and isinstance(content, polars.DataFrame | polars.LazyFrame)
    return to_arrow(content, "outbox content") if tabular else None


def _row_hashes(table: pa.Table) -> tuple[int, int]:
    """The row count and the sum of row hashes, columns in name order under positional names."""
    names = sorted(table.column_names)
    # Positional names: the frame's own column names need not be SQL identifiers.
    columns = [_hashable(table.column(n)) for n in names]
    renamed = pa.Table.from_arrays(columns, names=[f"c{i}" for i in range(len(names))])
    # A cursor of the process's DuckDB: a database of its own cost ~17 ms a fingerprint.
    con = embedded_database().cursor()
    try:
        con.register("content", renamed)
        cols = ", ".join(f"c{i}" for i in range(len(names))) or "NULL"
        try:
            count, total = con.execute(
                f"SELECT count(*), coalesce(sum(hash({cols})::HUGEINT), 0) FROM content"
            ).fetchall()[0]
        except duckdb.Error as exc:
            raise ConfigurationError(_unhashable(table, names, exc)) from exc
    finally:
        con.close()
    return count, int(total)


def _hashable(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A column DuckDB can hash, with the same values: float16 as float32, wide decimals as text."""
    if pa.types.is_float16(column.type):
        return pc.cast(column, pa.float32())
    if pa.types.is_decimal(column.type) and column.type.precision > 38:
        return pc.cast(column, pa.string())
    return column


def _unhashable(table: pa.Table, names: list[str], exc: Exception) -> str:
    bad = [n for n in names if not _hashes(table.column(n))]
    shown = ", ".join(f"'{n}' ({table.schema.field(n).type})" for n in bad) or "(unknown)"
    return (
        f"Refused to fingerprint the content: column(s) {shown} have a type the fingerprint"
        f" cannot read ({exc}). Nothing was sent. Fix: cast them to a plain type first, e.g."
        f" table.cast(...) or df['{bad[0] if bad else 'column'}'].astype(str)."
    )


def _hashes(column: pa.ChunkedArray) -> bool:
    con = embedded_database().cursor()
    try:
        con.register("one", pa.table({"c": _hashable(column)}))
        con.execute("SELECT sum(hash(c)::HUGEINT) FROM one").fetchall()
        return True
    except duckdb.Error:
        return False
    finally:
        con.close()


def _schema_hash(schema: pa.Schema) -> int:
    """A number for the column names and what each column's values mean, in name order."""
    text = "\x1e".join(f"{f.name}\x1f{_kind(f.type)}" for f in sorted(schema, key=lambda f: f.name))
    return int(hashlib.sha256(text.encode()).hexdigest()[:32], 16)


def _kind(t: pa.DataType) -> str:
    """What a column's values mean, whatever their width or encoding.

    The row hashes already tell widths apart where the values differ; they do not tell an
    instant from a wall-clock time, or a date from the count of days it is stored as.
    """
    if pa.types.is_dictionary(t):
        return _kind(t.value_type)
    if pa.types.is_timestamp(t):
        return "timestamptz" if t.tz else "timestamp"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return f"list<{_kind(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ",".join(f"{f.name}:{_kind(f.type)}" for f in t) + ">"
    if pa.types.is_map(t):
        return f"map<{_kind(t.key_type)},{_kind(t.item_type)}>"
    families = [
        (pa.types.is_null, "null"),
        (pa.types.is_boolean, "bool"),
        (pa.types.is_integer, "int"),
        (pa.types.is_floating, "float"),
        (pa.types.is_decimal, "decimal"),
        (_is_text, "text"),
        (_is_binary, "bytes"),
        (pa.types.is_date, "date"),
        (pa.types.is_time, "time"),
        (pa.types.is_duration, "duration"),
        (pa.types.is_interval, "interval"),
    ]
    return next((name for test, name in families if test(t)), str(t))


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _is_binary(t: pa.DataType) -> bool:
    return (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_binary_view(t)
        or pa.types.is_fixed_size_binary(t)
    )


def _digest(count: int, total: int) -> str:
    return f"{count}:{total % (1 << 128):032x}"


def _hashed(kind: str, data: bytes) -> str:
    return f"{kind}:{hashlib.sha256(data).hexdigest()[:32]}"
