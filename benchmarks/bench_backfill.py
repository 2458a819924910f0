"""4. Backfill: chunked ranges vs one publish per partition vs raw SQL per partition, in process."""

from collections.abc import Callable
from pathlib import Path

import duckdb
import pyarrow as pa

import idem_assets as ia
from benchmarks import data
from benchmarks.harness import Case, Line, Scale, interleave, line_from_times

#: (partitions, rows per partition, partitions per chunked publish, rounds) per scale.
SIZES: dict[Scale, tuple[int, int, int, int]] = {
    "tiny": (24, 1_000, 8, 2),
    "full": (365, 100_000, 31, 2),
}


class _Fresh:
    """A held connection to a new, empty database file for each round."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn: duckdb.DuckDBPyConnection | None = None
        self.fingerprint: str | None = None

    def open(self) -> None:
        self.path.unlink(missing_ok=True)
        Path(f"{self.path}.wal").unlink(missing_ok=True)
        self.conn = duckdb.connect(str(self.path))

    def close(self) -> None:
        assert self.conn is not None
        self.fingerprint = ia.table_fingerprint(self.conn, "main", data.TABLE)
        self.conn.close()
        self.conn = None

    def get(self) -> duckdb.DuckDBPyConnection:
        assert self.conn is not None
        return self.conn


def run(scale: Scale, repeat: int | None, workdir: Path) -> list[Line]:
    """Backfill every partition into an empty table three ways, interleaved."""
    partitions, rows, chunk, rounds = SIZES[scale]
    parts = [data.trips(d, rows) for d in range(partitions)]
    chunks = [list(range(i, min(i + chunk, partitions))) for i in range(0, partitions, chunk)]
    chunk_batches = [pa.concat_tables([parts[d] for d in c]) for c in chunks]
    chunk_windows = [data.window(c) for c in chunks]
    day_windows = [data.window([d]) for d in range(partitions)]
    bounds = [data.day_bounds(d) for d in range(partitions)]
    settings = data.settings("overwrite")

    per_name = f"{partitions} publishes"
    chunk_name = f"{len(chunks)} chunked publishes"
    raw_name = f"{partitions} raw SQL writes"
    dbs = {
        n: _Fresh(workdir / f"backfill_{i}.duckdb")
        for i, n in enumerate([per_name, chunk_name, raw_name])
    }

    def per_partition() -> None:
        conn = dbs[per_name].get()
        for batch, window in zip(parts, day_windows, strict=True):
            ia.publish(conn, batch, settings, window, now=data.NOW)

    def chunked() -> None:
        conn = dbs[chunk_name].get()
        for batch, window in zip(chunk_batches, chunk_windows, strict=True):
            ia.publish(conn, batch, settings, window, now=data.NOW)

    def raw() -> None:
        conn = dbs[raw_name].get()
        conn.register("first", parts[0])
        conn.execute(f"CREATE TABLE {data.TABLE} AS SELECT * FROM first LIMIT 0")
        conn.unregister("first")
        for batch, (start, end) in zip(parts, bounds, strict=True):
            data.raw_overwrite(conn, batch, start, end)

    runs: dict[str, Callable[[], None]] = {
        per_name: per_partition,
        chunk_name: chunked,
        raw_name: raw,
    }
    times = interleave(
        [Case(n, runs[n], prepare=dbs[n].open, cleanup=dbs[n].close) for n in runs],
        repeat or rounds,
        # Every round starts from an empty file, and a round takes minutes: no warm-up round.
        warmup=0,
    )
    equal = len({db.fingerprint for db in dbs.values()}) == 1
    size = f"{partitions}x{rows // 1000}k rows"
    overhead = line_from_times(
        "4 backfill",
        size,
        times,
        per_name,
        chunk_name,
        target=(">=", 5.0),
        equal=equal,
        notes=[
            f"{partitions} partitions x {rows:,} rows into an empty table on one held connection;"
            f" chunked = {chunk} partitions per publish. In-process only: a run per partition"
            " also pays Dagster's run launch (process start, code load, event writes), which is"
            " measured by the end-to-end daemon tests, not here"
        ],
    )
    per_raw = line_from_times(
        "4 backfill",
        "per partition",
        times,
        per_name,
        raw_name,
        equal=equal,
    )
    per_raw.notes.append(
        f"per partition: publish {overhead.a_median / partitions * 1000:.1f} ms, raw SQL"
        f" {per_raw.b_median / partitions * 1000:.1f} ms, chunked"
        f" {overhead.b_median / partitions * 1000:.1f} ms"
    )
    return [overhead, per_raw]
