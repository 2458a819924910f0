"""SQL over the staged batch, run by the library's own embedded DuckDB on Arrow.

Whatever engine stores the table, the guards and the audit judge the staged Arrow batch with
these statements, so one set of them serves every backend. Each function takes validated
identifiers (and window bounds) and returns SQL text plus the parameters to bind; values are
always bound parameters, identifiers are validated and quoted.
"""

from collections.abc import Sequence
from datetime import date, datetime
from typing import Any

from idem_assets.lib.identifiers import quote, validate_identifier

Bound = datetime | date
Statement = tuple[str, list[Any]]


def quoted_columns(columns: Sequence[str]) -> list[str]:
    """Validate and quote column names."""
    return [quote(validate_identifier(c, "column")) for c in columns]


def window_predicate(
    column: str, spans: Sequence[tuple[Bound, Bound]], alias: str | None = None
) -> Statement:
    """``column`` inside any half-open span: ``(c >= ? AND c < ?) OR ...``."""
    c = quote(validate_identifier(column, "partition column"))
    if alias:
        c = f"{alias}.{c}"
    return span_predicate(c, spans)


def span_predicate(expression: str, spans: Sequence[tuple[Bound, Bound]]) -> Statement:
    """``expression`` (SQL built from validated names) inside any half-open span."""
    parts = [f"({expression} >= ? AND {expression} < ?)" for _ in spans]
    params: list[Any] = [b for span in spans for b in span]
    return "(" + " OR ".join(parts) + ")", params


def dedupe(source: str, key: Sequence[str], order_by: Sequence[str], columns: Sequence[str]) -> str:
    """Keep one row per key: the greatest ``order_by`` wins.

    Ties on ``order_by`` are broken by every remaining column, so the winner never depends on
    the order rows arrived in; rows that tie on every column are identical, so any one will do.
    """
    # Sorted, so the winner of an exact tie does not depend on the batch's column order either.
    rest = sorted(c for c in columns if c not in key and c not in order_by)
    tie_break = [f"{c} DESC NULLS LAST" for c in quoted_columns(order_by)] + [
        f"{c} ASC NULLS LAST" for c in quoted_columns(rest)
    ]
    return (
        f"SELECT * FROM {source} QUALIFY row_number() OVER ("
        f"PARTITION BY {', '.join(quoted_columns(key))} ORDER BY {', '.join(tie_break)}) = 1"
    )


def batch_profile(
    source: str,
    partition_column: str | None,
    spans: Sequence[tuple[Bound, Bound]],
    key: Sequence[str],
    count_duplicates: bool = True,
) -> Statement:
    """One scan of the batch: rows, NULL partition values, stray rows, NULL keys, duplicates.

    Columns returned: ``rows, null_partition, outside_window, null_key, duplicate_keys``.
    """
    params: list[Any] = []
    if partition_column:
        p = quote(validate_identifier(partition_column, "partition column"))
        null_partition = f"count(*) FILTER (WHERE {p} IS NULL)"
        if spans:
            pred, params = window_predicate(partition_column, spans)
            outside = f"count(*) FILTER (WHERE {p} IS NOT NULL AND NOT {pred})"
        else:
            outside = "0"
    else:
        null_partition, outside = "0", "0"
    if key:
        kc = quoted_columns(key)
        null_key = "count(*) FILTER (WHERE " + " OR ".join(f"{c} IS NULL" for c in kc) + ")"
        tuple_expr = kc[0] if len(kc) == 1 else f"row({', '.join(kc)})"
        # count(DISTINCT) is the costliest part of the scan; skip it where nobody needs it.
        duplicates = f"count(*) - count(DISTINCT {tuple_expr})" if count_duplicates else "0"
    else:
        null_key, duplicates = "0", "0"
    sql = f"SELECT count(*), {null_partition}, {outside}, {null_key}, {duplicates} FROM {source}"
    return sql, params


def stray_rows_sample(
    source: str, partition_column: str, spans: Sequence[tuple[Bound, Bound]], limit: int = 5
) -> Statement:
    """A few rows dated outside the window, earliest first."""
    pred, params = window_predicate(partition_column, spans)
    p = quote(partition_column)
    return (
        f"SELECT * FROM {source} WHERE {p} IS NOT NULL AND NOT {pred}"
        f" ORDER BY {p} LIMIT {int(limit)}",
        params,
    )


def null_sample(source: str, columns: Sequence[str], limit: int = 5) -> str:
    """A few rows with NULL in any of ``columns``."""
    cond = " OR ".join(f"{c} IS NULL" for c in quoted_columns(columns))
    return f"SELECT * FROM {source} WHERE {cond} LIMIT {int(limit)}"


def duplicate_key_sample(source: str, key: Sequence[str], limit: int = 5) -> str:
    """Rows of the first few duplicated keys, grouped together."""
    kc = quoted_columns(key)
    k = ", ".join(kc)
    return (
        f"SELECT * FROM {source} WHERE ({k}) IN ("
        f"SELECT {k} FROM {source} GROUP BY {k} HAVING count(*) > 1"
        f" ORDER BY {k} LIMIT {int(limit)})"
        f" ORDER BY {k} LIMIT {int(limit) * 2}"
    )


def partition_case(
    partition_column: str, partitions: Sequence[tuple[str, Bound, Bound]]
) -> Statement:
    """A CASE naming the partition each row falls in (NULL outside them all)."""
    p = quote(validate_identifier(partition_column, "partition column"))
    case = " ".join(f"WHEN {p} >= ? AND {p} < ? THEN ?" for _ in partitions)
    params: list[Any] = [v for key, start, end in partitions for v in (start, end, key)]
    return f"CASE {case} END", params


def count_by_partition(
    relation: str, partition_column: str, partitions: Sequence[tuple[str, Bound, Bound]]
) -> Statement:
    """Rows of ``relation`` in each partition: rows of ``(key, count)``, empty ones absent."""
    case, params = partition_case(partition_column, partitions)
    pred, where_params = window_predicate(partition_column, [(s, e) for _, s, e in partitions])
    return (
        f"SELECT {case} AS partition_key, count(*) FROM {relation} WHERE {pred}"
        " GROUP BY partition_key",
        params + where_params,
    )
