"""Where publish time goes: each SQL statement's share, timed through a connection wrapper.

py-spy and pyinstrument see one opaque ``execute`` call; this wrapper names the statement. Run it
alone with ``python -m benchmarks.breakdown`` or let ``benchmarks.run`` append it to the results.
"""

import re
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

import idem_assets as ia
from benchmarks import bench_backfill, data
from benchmarks.bench_merge import merge_batch
from benchmarks.harness import Scale


class TimedConnection:
    """Passes everything to a DuckDB connection, timing ``execute`` per statement kind."""

    def __init__(self, conn: duckdb.DuckDBPyConnection) -> None:
        self._conn = conn
        self.seconds: dict[str, float] = defaultdict(float)

    def execute(self, query: str, parameters: Sequence[Any] | None = None) -> Any:
        """Run one statement; its time (and its fetch's) is added to the statement's kind."""
        kind = statement_kind(query)
        start = time.perf_counter()
        result = self._conn.execute(query, parameters)
        self.seconds[kind] += time.perf_counter() - start
        return _TimedResult(result, kind, self.seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class _TimedResult:
    """A result whose fetches count towards the statement that produced it."""

    def __init__(self, result: Any, kind: str, seconds: dict[str, float]) -> None:
        self._result, self._kind, self._seconds = result, kind, seconds

    def fetchall(self) -> list[tuple[Any, ...]]:
        start = time.perf_counter()
        rows = self._result.fetchall()
        self._seconds[self._kind] += time.perf_counter() - start
        return rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self._result, name)


_KINDS = [
    (r"^INSERT INTO", "INSERT (by name)"),
    (r"count\(DISTINCT", "batch profile (nulls, strays, duplicate keys)"),
    (r"sum\(hash\(", "fingerprint of the written window"),
    (r"^COMMIT", "COMMIT"),
    (r"^DELETE FROM \S+ USING", "DELETE matching keys"),
    (r"^DELETE", "DELETE window"),
    (r"^CREATE TEMP TABLE", "dedupe into temp table"),
    (r"JOIN", "merge counts (join batch with table)"),
    (r"^SELECT min\(", "run-time value guard (timestamps)"),
    (r"CAST\(.* AS VARCHAR\)", "run-time value guard (uuids)"),
    (r"^SELECT count\(\*\) FROM", "count window rows"),
    (r"information_schema|^DESCRIBE", "schema lookups"),
]


def statement_kind(query: str) -> str:
    """A short name for the statement ``publish`` sent."""
    q = " ".join(query.split())
    for pattern, name in _KINDS:
        if re.search(pattern, q):
            return name
    return "other (BEGIN, DROP temp, ...)"


def _profile(
    conn: duckdb.DuckDBPyConnection, write: Callable[[TimedConnection], object], rounds: int
) -> tuple[float, dict[str, float]]:
    timed = TimedConnection(conn)
    write(timed)
    timed.seconds.clear()
    start = time.perf_counter()
    for _ in range(rounds):
        write(timed)
    total = (time.perf_counter() - start) / rounds
    return total, {k: v / rounds for k, v in timed.seconds.items()}


SIZES: dict[Scale, tuple[int, int, int]] = {"tiny": (10_000, 5, 2), "full": (1_000_000, 30, 5)}


def run(scale: Scale, workdir: Path) -> str:
    """Markdown tables: statement shares of a 1M-row overwrite and of the merge benchmark."""
    rows, partitions, rounds = SIZES[scale]
    out = []
    conn = duckdb.connect(str(workdir / "breakdown_overwrite.duckdb"))
    try:
        data.load(conn, [data.trips(d, rows, seed=1) for d in range(5)])
        batch = data.trips(4, rows)
        settings, window = data.settings("overwrite"), data.window([4])
        total, parts = _profile(
            conn, lambda c: ia.publish(c, batch, settings, window, now=data.NOW), rounds
        )
        out.append(_table(f"overwrite publish, {rows:,} rows", total, parts))
    finally:
        conn.close()

    merge_rows = rows // 10
    conn = duckdb.connect(str(workdir / "breakdown_merge.duckdb"))
    try:
        days = [data.trips(d, merge_rows, seed=1) for d in range(partitions)]
        data.load(conn, days)
        day = partitions // 2
        batch, _ = merge_batch(day, days[day])
        settings = data.settings("merge", dedupe_order_by=["updated_at"])
        window = data.window([day])
        total, parts = _profile(
            conn, lambda c: ia.publish(c, batch, settings, window, now=data.NOW), rounds
        )
        out.append(
            _table(
                f"merge publish, {batch.num_rows:,} rows into {partitions * merge_rows:,}",
                total,
                parts,
            )
        )
    finally:
        conn.close()
    out.append(_backfill(scale, workdir))
    return "\n\n".join(out)


def _backfill(scale: Scale, workdir: Path) -> str:
    """One chunked publish of ``chunk`` partitions vs ``chunk`` one-partition publishes."""
    _, rows, chunk, _ = bench_backfill.SIZES[scale]
    parts = [data.trips(d, rows) for d in range(chunk)]
    settings = data.settings("overwrite")
    out = []
    for name, writes in (
        (f"backfill, one chunked publish of {chunk} x {rows:,} rows", [(parts, range(chunk))]),
        (
            f"backfill, {chunk} one-partition publishes of {rows:,} rows (summed)",
            [([p], [d]) for d, p in enumerate(parts)],
        ),
    ):
        path = workdir / f"breakdown_backfill_{len(out)}.duckdb"
        conn = duckdb.connect(str(path))
        try:
            timed = TimedConnection(conn)
            start = time.perf_counter()
            for batches, days in writes:
                batch = pa.concat_tables(batches)
                ia.publish(timed, batch, settings, data.window(list(days)), now=data.NOW)
            total = time.perf_counter() - start
            out.append(_table(name, total, dict(timed.seconds), per="for all"))
        finally:
            conn.close()
    return "\n\n".join(out)


def _table(
    title: str, total: float, parts: dict[str, float], per: str = "per publish (mean)"
) -> str:
    lines = [
        f"**{title}**: {total * 1000:,.0f} ms {per}",
        "",
        "| statement | ms | share |",
        "|---|--:|--:|",
    ]
    rest = total - sum(parts.values())
    for name, secs in sorted(parts.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {name} | {secs * 1000:,.1f} | {secs / total:.0%} |")
    lines.append(
        f"| Python, register/unregister, fetches | {rest * 1000:,.1f} | {rest / total:.0%} |"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="idem-bench-") as tmp:
        print(run("full", Path(tmp)))
