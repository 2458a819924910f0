"""PostgreSQL's dialect for the statements that read and write a target table.

Each function takes validated identifiers (and a window's region) and returns SQL text with ``$n``
placeholders plus the parameters to bind. Nothing here opens a connection.
"""

import hashlib
import re
from collections.abc import Sequence
from typing import Any

from idem_assets.lib.model.identifiers import quote
from idem_assets.lib.model.windows import Cell, Region
from idem_assets.lib.sql import statements as batch_sql
from idem_assets.lib.sql.statements import (
    Statement,
    partition_case,
    quoted_columns,
    region_predicate,
)

_PLACEHOLDER = re.compile(r"\?")


def numbered(statement: Statement) -> Statement:
    """``statement`` with its ``?`` placeholders numbered ``$1, $2, ...`` as libpq binds them."""
    query, params = statement
    counter = iter(range(1, len(params) + 1))
    # Safe: identifiers are validated plain names and no statement here holds a string literal.
    return _PLACEHOLDER.sub(lambda _: f"${next(counter)}", query), params


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
    return numbered(
        (
            "SELECT CASE WHEN c.relname <> ? THEN 0 WHEN n.nspname = ? THEN 1 ELSE 2 END,"
            " a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_catalog.pg_class c JOIN"
            " pg_catalog.pg_namespace n ON n.oid = c.relnamespace JOIN pg_catalog.pg_attribute"
            " a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped WHERE c.relkind"
            " IN ('r', 'p') AND ((n.nspname = ? AND c.relname IN (?, ?)) OR (n.nspname = ? AND"
            " c.relname = ?)) ORDER BY 1, a.attnum",
            [owners, schema, schema, table, owners, legacy_schema, owners],
        )
    )


def schema_exists(schema: str) -> Statement:
    """One row when ``schema`` exists, none otherwise."""
    return numbered(("SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = ?", [schema]))


def table_columns(schema: str, table: str) -> Statement:
    """A table's columns in order: rows of ``(name, type)``."""
    return numbered(
        (
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_catalog.pg_attribute"
            " a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid JOIN pg_catalog.pg_namespace n"
            " ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p') AND n.nspname = ? AND"
            " c.relname = ? AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            [schema, table],
        )
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


def count_window(target: str, region: Region) -> Statement:
    """Rows currently in the window (the whole table when unpartitioned)."""
    if not region:
        return f"SELECT count(*) FROM {target}", []
    pred, params = region_predicate(region)
    return numbered((f"SELECT count(*) FROM {target} WHERE {pred}", params))


def count_by_partition(target: str, cells: Sequence[Cell]) -> Statement:
    """Rows of ``target`` in each partition: rows of ``(key, count)``, empty ones absent."""
    return numbered(batch_sql.count_by_partition(target, cells))


def delete_window(target: str, region: Region) -> Statement:
    """Delete the window's rows (the overwrite's first half; never touches other partitions)."""
    pred, params = region_predicate(region)
    return numbered((f"DELETE FROM {target} WHERE {pred}", params))


def delete_all(target: str) -> str:
    """Delete every row: the scope of an unpartitioned asset is its whole table.

    DELETE, not TRUNCATE: TRUNCATE's lock would block every reader until the commit.
    """
    return f"DELETE FROM {target}"


def _key_in(keys: str, key: Sequence[str], ranges: Sequence[tuple[Any, Any]]) -> Statement:
    """Rows of ``t`` whose key ``keys`` holds, first narrowed to each key column's range.

    The range costs a comparison per row and spares the hash probe for every row outside it:
    keys handed out in order (ids, times) put a day's keys in a narrow range. Any key equal to
    one of the batch lies inside it, so it never drops a match.
    """
    # A semi-join: the keys table holds each key once, but IN stays right even if it did not.
    kc = quoted_columns(key)
    lhs = f"t.{kc[0]}" if len(kc) == 1 else "(" + ", ".join(f"t.{c}" for c in kc) + ")"
    narrow = "".join(f"t.{c} BETWEEN ? AND ? AND " for c in kc[: len(ranges)])
    params = [bound for low_high in ranges for bound in low_high]
    return f"{narrow}{lhs} IN (SELECT {', '.join(kc)} FROM {keys})", params


def delete_matching_keys(
    target: str, keys: str, key: Sequence[str], ranges: Sequence[tuple[Any, Any]]
) -> Statement:
    """Delete target rows whose key ``keys`` holds (the upsert's update half)."""
    hit, params = _key_in(keys, key, ranges)
    return numbered((f"DELETE FROM {target} t WHERE {hit}", params))


def merge_counts(
    target: str,
    keys: str,
    key: Sequence[str],
    ranges: Sequence[tuple[Any, Any]],
    region: Region,
) -> Statement:
    """Target rows whose key the batch holds: inside the window, and *outside* it.

    One scan of the table probing a hash of the batch's keys (a hashed subplan); ``ranges``
    holds each key column's least and greatest value in the batch.
    """
    hit, hit_params = _key_in(keys, key, ranges)
    if not region:
        return numbered((f"SELECT count(*), 0 FROM {target} t WHERE {hit}", hit_params))
    pred_t, params = region_predicate(region, alias="t")
    return numbered(
        (
            f"SELECT count(*) FILTER (WHERE {pred_t}), count(*) FILTER (WHERE NOT {pred_t})"
            f" FROM {target} t WHERE {hit}",
            params + params + hit_params,
        )
    )


def matched_by_partition(
    target: str,
    keys: str,
    key: Sequence[str],
    ranges: Sequence[tuple[Any, Any]],
    cells: Sequence[Cell],
) -> Statement:
    """Target rows whose key the batch holds, per partition (NULL: outside them all)."""
    case, params = partition_case(cells, alias="t")
    hit, hit_params = _key_in(keys, key, ranges)
    return numbered(
        (
            f"SELECT {case} AS partition_key, count(*) FROM {target} t WHERE {hit} GROUP BY 1",
            params + hit_params,
        )
    )


def keys_outside_window_sample(
    target: str,
    keys: str,
    key: Sequence[str],
    ranges: Sequence[tuple[Any, Any]],
    region: Region,
    limit: int = 5,
) -> Statement:
    """Existing rows outside the window whose key the batch also holds."""
    hit, hit_params = _key_in(keys, key, ranges)
    pred_t, params = region_predicate(region, alias="t")
    return numbered(
        (
            f"SELECT t.* FROM {target} t WHERE {hit} AND NOT {pred_t} LIMIT {int(limit)}",
            hit_params + params,
        )
    )


def select_rows(target: str, columns: Sequence[str], region: Region) -> Statement:
    """The window's rows (the whole table without one) in no particular order, to hash."""
    where, params = "", []
    if region:
        pred, params = region_predicate(region)
        where = f" WHERE {pred}"
    return numbered((f"SELECT {', '.join(quoted_columns(columns))} FROM {target}{where}", params))


def rows_without_keys(
    target: str,
    columns: Sequence[str],
    keys: str,
    key: Sequence[str],
    region: Region,
) -> Statement:
    """The window's rows whose key ``keys`` does not hold: those an upsert keeps."""
    kc = quoted_columns(key)
    cond = " AND ".join(f"k.{c} = t.{c}" for c in kc)
    where, params = "", []
    if region:
        pred, params = region_predicate(region, alias="t")
        where = f"{pred} AND "
    cols = ", ".join(f"t.{c}" for c in quoted_columns(columns))
    return numbered(
        (
            f"SELECT {cols} FROM {target} t WHERE {where}"
            f"NOT EXISTS (SELECT 1 FROM {keys} k WHERE {cond})",
            params,
        )
    )


def select_window(
    target: str, partition_columns: Sequence[str], region: Region, nothing: bool
) -> Statement:
    """The window's rows in partition order: the region's predicate runs on the server."""
    where, params, order = "", [], ""
    if partition_columns:
        order = f" ORDER BY {', '.join(quoted_columns(partition_columns))}"
    if nothing:
        where = " WHERE false"
    elif region:
        pred, params = region_predicate(region)
        where = f" WHERE {pred}"
    return numbered((f"SELECT * FROM {target}{where}{order}", params))
