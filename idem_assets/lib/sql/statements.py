"""SQL over the staged batch, run by the library's own embedded DuckDB on Arrow.

Whatever engine stores the table, the guards and the audit judge the staged Arrow batch with
these statements, so one set of them serves every backend. Each function takes validated
identifiers (and window bounds) and returns SQL text plus the parameters to bind; values are
always bound parameters, identifiers are validated and quoted.
"""

from collections.abc import Sequence
from typing import Any

from idem_assets.lib.model.identifiers import quote, validate_identifier
from idem_assets.lib.model.windows import Bound, Box, Cell, Region

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


def span_predicate(
    expression: str, spans: Sequence[tuple[Bound, Bound]] | Sequence[tuple[int, int]]
) -> Statement:
    """``expression`` (SQL built from validated names) inside any half-open span."""
    parts = [f"({expression} >= ? AND {expression} < ?)" for _ in spans]
    params: list[Any] = [b for span in spans for b in span]
    return "(" + " OR ".join(parts) + ")", params


def region_predicate(region: Region, alias: str | None = None) -> Statement:
    """Rows in any box of ``region``: ``(time spans AND category IN (...)) OR ...``."""
    parts, params = [], []
    for box in region:
        pred, box_params = box_predicate(box, alias)
        parts.append(pred)
        params += box_params
    return (parts[0] if len(parts) == 1 else "(" + " OR ".join(parts) + ")"), params


def box_predicate(box: Box, alias: str | None = None) -> Statement:
    """Rows meeting every condition of ``box``."""
    parts, params = [], []
    for cond in box:
        c = quote(validate_identifier(cond.column, "partition column"))
        if alias:
            c = f"{alias}.{c}"
        if cond.spans:
            pred, span_params = span_predicate(c, cond.spans)
            parts.append(pred)
            params += span_params
        else:
            parts.append(f"({c} IN ({', '.join('?' for _ in cond.values)}))")
            params += list(cond.values)
    return (parts[0] if len(parts) == 1 else "(" + " AND ".join(parts) + ")"), params


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
    partition_columns: Sequence[str],
    region: Region,
    key: Sequence[str],
    count_duplicates: bool = True,
) -> Statement:
    """One scan of the batch: rows, NULL partition values, stray rows, NULL keys, duplicates.

    Columns returned: ``rows, null_partition, outside_window, null_key, duplicate_keys``.
    """
    params: list[Any] = []
    if partition_columns:
        nulls = " OR ".join(f"{c} IS NULL" for c in quoted_columns(partition_columns))
        null_partition = f"count(*) FILTER (WHERE {nulls})"
        if region:
            pred, params = region_predicate(region)
            outside = f"count(*) FILTER (WHERE NOT ({nulls}) AND NOT {pred})"
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


def rounded_out_of_window(
    source: str,
    column: str,
    digits: int,
    spans: Sequence[tuple[int, int]],
    aware: bool,
    limit: int = 5,
) -> Statement:
    """Rows inside the window as sent that rounding to ``digits`` fractional digits moves out.

    Values and ``spans`` are compared as nanoseconds since the epoch (naive values as if UTC,
    as their bounds are), rounded half away from zero. Columns returned: ``batch_value,
    stored_value, rows`` (``rows`` counts them all), the values as text so nanoseconds survive.
    """
    c = quote(validate_identifier(column, "partition column"))
    ns, step = f"epoch_ns({c})", 10 ** (9 - digits)
    half = step // 2
    stored = (
        f"(CASE WHEN {ns} >= 0 THEN ({ns} + {half}) // {step} * {step}"
        f" ELSE -((-{ns} + {half}) // {step} * {step}) END)"
    )
    inside, params = span_predicate(ns, spans)
    stays, stored_params = span_predicate(stored, spans)
    # An aware value reads as text in the evaluator's zone: shown from its instant, in UTC.
    zone = " || '+00'" if aware else ""
    shown = (
        f"CAST(make_timestamp({ns} // 1000) AS VARCHAR){zone}" if aware else f"CAST({c} AS VARCHAR)"
    )
    return (
        f"SELECT {shown} AS batch_value,"
        f" CAST(make_timestamp({stored} // 1000) AS VARCHAR){zone} AS stored_value,"
        f" count(*) OVER () AS rows FROM {source} WHERE {c} IS NOT NULL AND {inside}"
        f" AND NOT {stays} ORDER BY {c} LIMIT {int(limit)}",
        params + stored_params,
    )


def stray_rows_sample(
    source: str, partition_columns: Sequence[str], region: Region, limit: int = 5
) -> Statement:
    """A few rows outside the window (a NULL partition value is not stray), in column order."""
    pred, params = region_predicate(region)
    pcs = quoted_columns(partition_columns)
    not_null = " AND ".join(f"{c} IS NOT NULL" for c in pcs)
    return (
        f"SELECT * FROM {source} WHERE {not_null} AND NOT {pred}"
        f" ORDER BY {', '.join(pcs)} LIMIT {int(limit)}",
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


def partition_case(cells: Sequence[Cell], alias: str | None = None) -> Statement:
    """A CASE naming the partition each row falls in (NULL outside them all)."""
    case, params = [], []
    for key, box in cells:
        pred, box_params = box_predicate(box, alias)
        case.append(f"WHEN {pred} THEN ?")
        params += [*box_params, key]
    return f"CASE {' '.join(case)} END", params


def count_by_partition(relation: str, cells: Sequence[Cell]) -> Statement:
    """Rows of ``relation`` in each partition: rows of ``(key, count)``, empty ones absent."""
    case, params = partition_case(cells)
    pred, where_params = region_predicate(tuple(box for _, box in cells))
    return (
        f"SELECT {case} AS partition_key, count(*) FROM {relation} WHERE {pred} GROUP BY 1",
        params + where_params,
    )
