"""The statements only PostgreSQL spells: its catalog, its locks, its DDL.

Every statement that counts, deletes or reads a window is :mod:`idem_assets.lib.sql.statements`',
rendered in PostgreSQL's dialect (``$n`` placeholders). Nothing here opens a connection.
"""

import hashlib
from collections.abc import Sequence

from idem_assets.lib.model.identifiers import quote, validate_identifier
from idem_assets.lib.sql.predicates import Statement


def quoted_columns(names: Sequence[str]) -> list[str]:
    """Validate and quote column names."""
    return [quote(validate_identifier(c, "column")) for c in names]


def lock_key(schema: str, table: str, partition: str | None) -> int:
    """The advisory lock of one partition of a table (the whole table when ``None``).

    A signed 64-bit hash computed here rather than by ``hashtext`` on the server, so every
    writer sorts its locks by the very numbers it locks: overlapping windows then take their
    common locks in one order and cannot deadlock. A collision only makes two windows wait for
    each other.
    """
    text = f"{schema}\x00{table}\x00{partition if partition is not None else ''}"
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def table_lock(schema: str, table: str, purpose: str) -> int:
    """The advisory lock of one of a table's own concerns (``schema``, ``keys``).

    Never a partition's: its text starts with ``purpose`` and a separator no identifier holds.
    """
    text = f"{purpose}\x01{schema}\x00{table}"
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


#: The lock every writer takes before it creates a schema, a table or the owners record.
DDL_LOCK = lock_key("idem", "ddl", None)


def describe(owners: str, legacy_schema: str, schema: str, table: str) -> Statement:
    """The columns of the target and of the owners tables: rows of ``(kind, name, type)``.

    ``kind`` is 0 for the target, 1 for the owners table ``owners`` of its schema, 2 for the
    one of ``legacy_schema``, where the records were once kept.
    """
    return Statement(
        "SELECT CASE WHEN c.relname <> $1 THEN 0 WHEN n.nspname = $2 THEN 1 ELSE 2 END,"
        " a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_catalog.pg_class c JOIN"
        " pg_catalog.pg_namespace n ON n.oid = c.relnamespace JOIN pg_catalog.pg_attribute"
        " a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped WHERE c.relkind"
        " IN ('r', 'p') AND ((n.nspname = $3 AND c.relname IN ($4, $5)) OR (n.nspname = $6 AND"
        " c.relname = $7)) ORDER BY 1, a.attnum",
        [owners, schema, schema, table, owners, legacy_schema, owners],
    )


def schema_exists(schema: str) -> Statement:
    """One row when ``schema`` exists, none otherwise."""
    return Statement("SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1", [schema])


def table_columns(schema: str, table: str) -> Statement:
    """A table's columns in order: rows of ``(name, type)``."""
    return Statement(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_catalog.pg_attribute"
        " a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid JOIN pg_catalog.pg_namespace n"
        " ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p') AND n.nspname = $1 AND"
        " c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        [schema, table],
    )


def numeric_digits(target: str, column: str) -> str:
    """The digits a ``numeric`` column's values need: one row of ``(integer, scale, exact)``.

    ``exact``: whether every value reads back unchanged through a double.
    """
    c = quote(column)
    # A double holds magnitudes up to about 1e308; a larger value is not exact in one anyway.
    exact = f"CASE WHEN abs({c}) < 1e300 THEN {c}::float8::numeric = {c} ELSE false END"
    return (
        f"SELECT max(length(trunc(abs({c}))::text)), max(scale({c})), bool_and({exact})"
        f" FROM {target} WHERE {c} <> 'NaN'"
    )


def create_table(target: str, columns: Sequence[tuple[str, str]]) -> str:
    """Create ``target`` with ``(name, type_sql)`` columns."""
    cols = ", ".join(f"{quote(name)} {kind}" for name, kind in columns)
    return f"CREATE TABLE {target} ({cols})"


def create_index(target: str, columns: Sequence[str]) -> str:
    """A B-tree index on ``columns``; Postgres names it (``trips_pickup_at_idx``)."""
    return f"CREATE INDEX ON {target} ({', '.join(quoted_columns(columns))})"


def create_key_ranges_index(target: str, columns: Sequence[str]) -> str:
    """A BRIN index on ``columns``: each block range's least and greatest value.

    Nearly free to keep up on insert, unlike a B-tree; ``autosummarize`` lets autovacuum
    summarise the ranges new rows fill, so they too are skipped when their keys do not overlap.
    """
    cols = ", ".join(quoted_columns(columns))
    return f"CREATE INDEX ON {target} USING brin ({cols}) WITH (autosummarize = on)"


def declare_cursor(name: str, query: Statement) -> Statement:
    """A server-side cursor ``name`` over ``query``, its values still bound; in a transaction.

    ``NO SCROLL``: read forward once, so the server keeps no rows already fetched.
    """
    return Statement(f"DECLARE {quote(name)} NO SCROLL CURSOR FOR {query.sql}", query.params)


def fetch_forward(name: str, rows: int) -> str:
    """The next ``rows`` rows of cursor ``name`` (fewer at its end, none past it)."""
    # FETCH takes its count as a literal only; it is a number this module was given.
    return f"FETCH FORWARD {int(rows)} FROM {quote(name)}"


def close_cursor(name: str) -> str:
    """Close cursor ``name``: the server frees what it held for it (a sort's files)."""
    return f"CLOSE {quote(name)}"
