"""DuckDB's dialect for the statements that read and write a target table.

Each function takes validated identifiers (and window bounds) and returns SQL text plus the
parameters to bind. Nothing here opens a connection, so every statement is unit-testable.
"""

from collections.abc import Sequence

from idem_assets.lib.model.windows import Cell, Region
from idem_assets.lib.sql.statements import (
    Statement,
    count_by_partition,
    partition_case,
    quoted_columns,
    region_predicate,
)

__all__ = ["count_by_partition"]


def delete_window(target: str, region: Region) -> Statement:
    """Delete the window's rows (the overwrite's first half; never touches other partitions)."""
    pred, params = region_predicate(region)
    return f"DELETE FROM {target} WHERE {pred}", params


def delete_all(target: str) -> str:
    """Delete every row: the scope of an unpartitioned asset is its whole table."""
    return f"DELETE FROM {target}"


def delete_matching_keys(target: str, source: str, key: Sequence[str]) -> str:
    """Delete target rows whose key appears in ``source`` (the upsert's update half)."""
    cond = " AND ".join(f"{target}.{c} = {source}.{c}" for c in quoted_columns(key))
    return f"DELETE FROM {target} USING {source} WHERE {cond}"


def insert_by_name(target: str, source: str, order_by: Sequence[str] = ()) -> str:
    """Insert ``source`` matching columns by name, in partition order when one is given.

    Inserting in partition order keeps each partition in few row groups, so DuckDB's zone maps
    let the next window delete skip the rest of the table.
    """
    order = f" ORDER BY {', '.join(quoted_columns(order_by))}" if order_by else ""
    return f"INSERT INTO {target} BY NAME SELECT * FROM {source}{order}"


def count_window(target: str, region: Region) -> Statement:
    """Rows currently in the window (the whole table when unpartitioned)."""
    if not region:
        return f"SELECT count(*) FROM {target}", []
    pred, params = region_predicate(region)
    return f"SELECT count(*) FROM {target} WHERE {pred}", params


def _key_in(source: str, key: Sequence[str], alias: str = "t") -> str:
    # A semi-join: duplicate keys in the batch cannot multiply the matches.
    kc = quoted_columns(key)
    lhs = f"{alias}.{kc[0]}" if len(kc) == 1 else "(" + ", ".join(f"{alias}.{c}" for c in kc) + ")"
    return f"{lhs} IN (SELECT {', '.join(kc)} FROM {source})"


def merge_counts(
    target: str,
    source: str,
    key: Sequence[str],
    region: Region,
) -> Statement:
    """Target rows whose key the batch holds: inside the window, and *outside* it.

    Columns returned: ``matched_in_window, matched_outside_window``.
    """
    if not region:
        return f"SELECT count(*), 0 FROM {target} t WHERE {_key_in(source, key)}", []
    pred_t, params = region_predicate(region, alias="t")
    return (
        f"SELECT count(*) FILTER (WHERE {pred_t}), count(*) FILTER (WHERE NOT {pred_t})"
        f" FROM {target} t WHERE {_key_in(source, key)}",
        params + params,
    )


def keys_outside_window_sample(
    target: str,
    source: str,
    key: Sequence[str],
    region: Region,
    limit: int = 5,
) -> Statement:
    """Existing rows outside the window whose key the batch also holds."""
    pred_t, params = region_predicate(region, alias="t")
    return (
        f"SELECT t.* FROM {target} t WHERE {_key_in(source, key)} AND NOT {pred_t}"
        f" LIMIT {int(limit)}",
        params,
    )


def matched_by_partition(
    target: str,
    source: str,
    key: Sequence[str],
    cells: Sequence[Cell],
) -> Statement:
    """Target rows whose key the batch holds, per partition: rows of ``(key, count)``.

    Rows outside every partition come back under the key NULL.
    """
    case, params = partition_case(cells, alias="t")
    return (
        f"SELECT {case} AS partition_key, count(*) FROM {target} t WHERE {_key_in(source, key)}"
        " GROUP BY 1",
        params,
    )


def partition_fingerprints(
    target: str,
    columns: Sequence[str],
    cells: Sequence[Cell],
) -> Statement:
    """Per-partition count and hash sum in one scan: rows of ``(key, count, hash_sum)``.

    Used after a range (chunked backfill) publish, so each partition's materialization can
    carry its own row count and fingerprint rather than the range's totals.
    """
    cols = ", ".join(quoted_columns(sorted(columns)))
    case, params = partition_case(cells)
    pred, where_params = region_predicate(tuple(box for _, box in cells))
    return (
        f"SELECT {case} AS partition_key, count(*),"
        f" coalesce(sum(hash({cols})::HUGEINT), 0) FROM {target} WHERE {pred}"
        " GROUP BY 1",
        params + where_params,
    )


def fingerprint(
    target: str,
    columns: Sequence[str],
    region: Region = (),
) -> Statement:
    """An order-independent fingerprint of the rows: their count and the sum of row hashes.

    A sum (not an XOR) is used so that a doubled row changes the fingerprint.
    """
    cols = ", ".join(quoted_columns(sorted(columns)))
    where, params = "", []
    if region:
        pred, params = region_predicate(region)
        where = f" WHERE {pred}"
    return (
        f"SELECT count(*), coalesce(sum(hash({cols})::HUGEINT), 0) FROM {target}{where}",
        params,
    )
