"""Sample rows: fetched by a query, shown in an error message or as check metadata."""

from collections.abc import Sequence
from typing import Any

import duckdb


def fetch(
    conn: duckdb.DuckDBPyConnection, query: str, params: Sequence[Any] = ()
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The column names and rows ``query`` returns."""
    cur = conn.execute(query, list(params))
    return [d[0] for d in cur.description or []], cur.fetchall()


def _show(value: Any) -> str:
    # Strings keep their quotes so blanks and padding stay visible; dates read as ISO text.
    return repr(value) if isinstance(value, str) or value is None else str(value)


def format_sample(columns: Sequence[str], rows: Sequence[Sequence[Any]], limit: int = 5) -> str:
    """Render up to ``limit`` rows as indented ``col=value`` lines for an error message."""
    lines = []
    for row in rows[:limit]:
        pairs = ", ".join(f"{c}={_show(v)}" for c, v in zip(columns, row, strict=False))
        lines.append(f"    {pairs}")
    return "\n".join(lines)


def sample_text(conn: duckdb.DuckDBPyConnection, query: str, params: Sequence[Any] = ()) -> str:
    """The rows of ``query``, rendered for an error message."""
    return format_sample(*fetch(conn, query, params))


def sample_records(
    conn: duckdb.DuckDBPyConnection, query: str, params: Sequence[Any] = ()
) -> list[dict[str, Any]]:
    """Rows of ``query`` as plain dicts, non-scalar values as text (for UI metadata)."""
    columns, rows = fetch(conn, query, params)
    return [
        {
            c: (v if isinstance(v, int | float | str | bool) or v is None else str(v))
            for c, v in zip(columns, r, strict=True)
        }
        for r in rows
    ]
