"""Soak: many publishes of random partitions leak no tables, files, handles or memory.

Phase one (1,000 publishes under IDEM_FULL, 150 by default) opens a connection per publish, as
the IO managers do; phase two (a third as many) keeps one connection for every publish, as a
long-lived process would, with a small checkpoint threshold so the WAL is checkpointed along the
way. Numbers are printed in the reliability report.
"""

import gc
import os
import random
from pathlib import Path

import duckdb

import idem_assets as ia

from .support import METADATA, NOW, REPORT, SEED, count, days, range_batch, settings, window

DAYS = days("2026-01-01", 20)
ROWS_PER_DAY = 2_000
PUBLISHES = count(150, 1000)
LONG_LIVED = PUBLISHES // 3
TABLES = {"overwrite": "trips_overwrite", "merge": "trips_merge"}
MERGE = {**METADATA, "dedupe_order_by": ["updated_at"]}
MIB = 1024 * 1024


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss() -> int:
    gc.collect()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def leftovers(conn: duckdb.DuckDBPyConnection) -> list[tuple]:
    """Temporary tables and views (the staged batch is a view while registered)."""
    return conn.execute(
        "SELECT 'table', table_name FROM duckdb_tables() WHERE temporary"
        " UNION ALL SELECT 'view', view_name FROM duckdb_views() WHERE temporary AND NOT internal"
    ).fetchall()


def one_publish(conn: duckdb.DuckDBPyConnection, rng: random.Random) -> None:
    mode = rng.choice(["overwrite", "merge"])
    first = rng.randrange(len(DAYS))
    keys = DAYS[first : first + rng.randint(1, 3)]
    # Re-sent copies only for the merge, whose dedupe_order_by resolves them.
    duplicates = rng.choice([0, 0, 5]) if mode == "merge" else 0
    batch = range_batch(keys, ROWS_PER_DAY, rng.randint(0, 3), duplicates=duplicates)
    metadata = MERGE if mode == "merge" else METADATA
    ia.publish(conn, batch, settings(mode, metadata, table=TABLES[mode]), window(*keys), now=NOW)


def test_soak_keeps_file_size_wal_handles_and_memory_bounded(tmp_path: Path) -> None:
    db = tmp_path / "soak.duckdb"
    wal = Path(f"{db}.wal")
    rng = random.Random(f"{SEED}/soak")
    with duckdb.connect(str(db)) as conn:
        for mode, table in TABLES.items():
            batch = range_batch(DAYS, ROWS_PER_DAY)
            metadata = MERGE if mode == "merge" else METADATA
            ia.publish(conn, batch, settings(mode, metadata, table=table), window(*DAYS), now=NOW)
    loaded = size(db)
    fds_before, rss_before = open_fds(), rss()

    # Phase one: a connection per publish, like the IO managers.
    per_connection = PUBLISHES
    sizes, wals = [], []
    warm_rss = 0
    for i in range(per_connection):
        with duckdb.connect(str(db)) as conn:
            one_publish(conn, rng)
            assert leftovers(conn) == [], f"publish {i} left {leftovers(conn)}"
        sizes.append(size(db))
        wals.append(size(wal))
        if i == per_connection // 5:
            warm_rss = rss()
    fds_after = open_fds()
    rss_after = rss()

    # Phase two: one long-lived connection; the WAL is checkpointed every 4 MiB.
    long_sizes, long_wals = [], []
    with duckdb.connect(str(db), config={"checkpoint_threshold": "4MB"}) as conn:
        for i in range(LONG_LIVED):
            one_publish(conn, rng)
            assert leftovers(conn) == [], f"publish {i} left {leftovers(conn)}"
            long_sizes.append(size(db))
            long_wals.append(size(wal))
        tables = conn.execute("SELECT table_name FROM duckdb_tables() ORDER BY ALL").fetchall()
        stored = conn.execute(
            "SELECT (SELECT count(*) FROM trips_overwrite), (SELECT count(*) FROM trips_merge)"
        ).fetchall()[0]
    fds_end, rss_end = open_fds(), rss()

    REPORT.append(
        f"soak: {PUBLISHES} + {LONG_LIVED} publishes of 1-3 random days of {ROWS_PER_DAY:,}"
        f" rows into two tables of {len(DAYS)} days ({stored[0]:,} and {stored[1]:,} rows at"
        " the end)"
    )
    REPORT.append(
        f"soak file: {loaded / MIB:.1f} MiB after the first load; connection per publish:"
        f" max {max(sizes) / MIB:.1f} MiB, end {sizes[-1] / MIB:.1f} MiB, WAL after close max"
        f" {max(wals) / 1024:.0f} KiB; one connection: max {max(long_sizes) / MIB:.1f} MiB,"
        f" WAL max {max(long_wals) / MIB:.1f} MiB"
    )
    REPORT.append(
        f"soak handles: {fds_before} open fds before, {fds_after} after phase one, {fds_end} at"
        f" the end; RSS {rss_before / MIB:.0f} MiB before, {warm_rss / MIB:.0f} MiB after"
        f" warm-up, {rss_after / MIB:.0f} MiB after phase one, {rss_end / MIB:.0f} MiB at the end"
    )

    assert tables == [("idem-table-owners",), ("trips_merge",), ("trips_overwrite",)]
    # Rows: every day holds one version of its 2,000 trips (a correction has ~2,000 too).
    assert all(len(DAYS) * ROWS_PER_DAY * 0.8 < n < len(DAYS) * ROWS_PER_DAY * 1.2 for n in stored)
    # File: freed blocks are reused, so the file stays near the size of the data; a leaked
    # staging table per publish would add about 0.1 MiB each.
    assert max(sizes + long_sizes) < 3 * loaded + 4 * MIB
    assert max(wals) < 64 * 1024, "close() did not checkpoint the WAL"
    assert max(long_wals) < 4 * MIB + 8 * MIB, "the WAL grew past its checkpoint threshold"
    assert fds_after <= fds_before + 2 and fds_end <= fds_before + 2
    assert rss_after - warm_rss < 96 * MIB and rss_end - warm_rss < 128 * MIB
