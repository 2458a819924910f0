"""The reference's worked example, computed for real: append vs overwrite vs merge, run twice.

Three days of 1,000 rows each are written twice to an empty table with each write pattern.
Appending doubles the table; the overwrite and merge publishers leave it at 3,000 rows.
"""

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import dagster as dg
import duckdb
import pyarrow as pa

import idem_assets as ia

DAYS = [date(2026, 1, 1), date(2026, 1, 2), date(2026, 1, 3)]
ROWS_PER_DAY = 1000
_DAILY = dg.DailyPartitionsDefinition(start_date="2026-01-01")


def day_batch(day: date, rows: int = ROWS_PER_DAY) -> pa.Table:
    """A deterministic batch of ``rows`` events on ``day``."""
    start = datetime(day.year, day.month, day.day)
    return pa.table(
        {
            "event_id": [f"{day.isoformat()}-{i:05d}" for i in range(rows)],
            "event_at": [start + timedelta(seconds=86_400 * i // rows) for i in range(rows)],
            "amount": [float(i % 97) for i in range(rows)],
        }
    )


def _append(con: duckdb.DuckDBPyConnection, batch: pa.Table) -> None:
    con.register("batch", batch)
    con.execute("CREATE TABLE IF NOT EXISTS events_append AS SELECT * FROM batch LIMIT 0")
    con.execute("INSERT INTO events_append SELECT * FROM batch")
    con.unregister("batch")


def _write(con: duckdb.DuckDBPyConnection, mode: ia.WriteMode, day: date) -> None:
    settings = ia.resolve_settings(
        asset_key=dg.AssetKey(f"events_{mode}"),
        metadata={"partition_expr": "event_at", "primary_key": ["event_id"]},
        mode=mode,
        default_schema="main",
        partitioned=True,
    )
    window = ia.window_from_keys(_DAILY, [day.isoformat()], settings.asset)
    ia.publish(con, day_batch(day), settings, window, now=datetime(2026, 1, 4, tzinfo=UTC))


def run_worked_example(database: str) -> list[tuple[str, int, int]]:
    """Rows after run 1 and run 2 for append, overwrite and merge, in a fresh database file."""
    Path(database).unlink(missing_ok=True)
    Path(database).parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(database)
    try:
        counts: dict[str, list[int]] = {"append": [], "overwrite": [], "merge": []}
        for _run in range(2):
            for day in DAYS:
                _append(con, day_batch(day))
                _write(con, "overwrite", day)
                _write(con, "merge", day)
            for pattern in counts:
                n = con.execute(f"SELECT count(*) FROM events_{pattern}").fetchall()[0][0]
                counts[pattern].append(n)
        return [(pattern, runs[0], runs[1]) for pattern, runs in counts.items()]
    finally:
        con.close()
        Path(database).unlink(missing_ok=True)


def render_table(rows: list[tuple[str, int, int]]) -> str:
    """A small text table: write pattern, rows after run 1, rows after run 2."""
    lines = [
        f"  {'write pattern':<16}{'after run 1':>14}{'after run 2':>14}",
        "  " + "-" * 44,
    ]
    lines += [f"  {p:<16}{a:>14,}{b:>14,}" for p, a, b in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render_table(run_worked_example(".data/worked_example.duckdb")))
