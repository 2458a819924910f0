"""5. Scaling: overwriting one partition as the table grows from 10 to 365 partitions."""

from pathlib import Path

import duckdb

import idem_assets as ia
from benchmarks import data
from benchmarks.harness import Case, Line, Scale, interleave, line_from_times

#: (partition counts, rows per partition, rounds) per scale.
SIZES: dict[Scale, tuple[tuple[int, ...], int, int]] = {
    "tiny": ((3, 6, 12), 1_000, 2),
    "full": ((10, 100, 365), 100_000, 21),
}
#: The overwritten day exists in every table; it is not the newest, so the rows after it count.
TARGET_DAY = 2


def run(scale: Scale, repeat: int | None, workdir: Path) -> list[Line]:
    """The same one-partition overwrite on tables of increasing size, interleaved."""
    counts, rows, rounds = SIZES[scale]
    parts = [data.trips(d, rows, seed=1) for d in range(max(counts))]
    conns = {}
    for n in counts:
        conn = duckdb.connect(str(workdir / f"scaling_{n}.duckdb"))
        data.load(conn, parts[:n])  # in partition order, as a daily schedule writes them
        conns[n] = conn
    del parts
    batch = data.trips(TARGET_DAY, rows)
    settings = data.settings("overwrite")
    window = data.window([TARGET_DAY])
    bounds = data.day_bounds(TARGET_DAY)

    def ours(n: int) -> Case:
        return Case(
            f"{n} partitions",
            lambda: ia.publish(conns[n], batch, settings, window, now=data.NOW),
        )

    def raw(n: int) -> Case:
        # The same rows into the same window, so it can share the table with ``ours``.
        return Case(
            f"raw SQL, {n} partitions", lambda: data.raw_overwrite(conns[n], batch, *bounds)
        )

    try:
        times = interleave([ours(n) for n in counts] + [raw(n) for n in counts], repeat or rounds)
        prints = {
            ia.table_fingerprint(c, "main", data.TABLE, data.PARTITION_COLUMN, window)
            for c in conns.values()
        }
    finally:
        for conn in conns.values():
            conn.close()
    lines = [
        line_from_times(
            "5 scaling",
            f"{rows // 1000}k-row overwrite",
            times,
            f"{n} partitions",
            f"{counts[0]} partitions",
            target=("<=", 1.2),
            equal=len(prints) == 1,
        )
        for n in counts[1:]
    ]
    context = line_from_times(
        "5 scaling",
        "raw SQL, same tables",
        times,
        f"raw SQL, {counts[-1]} partitions",
        f"raw SQL, {counts[0]} partitions",
    )
    context.notes.append(
        f"one {rows:,}-row partition (day {TARGET_DAY}) overwritten in tables of"
        f" {', '.join(map(str, counts))} partitions x {rows:,} rows, loaded in partition order;"
        " the raw SQL line overwrites the same window of the same tables, showing what DuckDB"
        " itself adds as the table grows (its automatic checkpoint, every ~16 MB of WAL, costs"
        " more on a bigger table)"
    )
    return [*lines, context]
