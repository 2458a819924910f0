"""12. Streamed publishes and loads: memory flat in the batch's size, speed against raw ingest.

A day of 2M and of 20M trips (about 1.2 GB as Arrow at 20M) arrives as a RecordBatchReader and
is published on DuckDB, PostgreSQL and Delta Lake. Each measurement is a child process (``python
-m benchmarks.bench_streams --child ...``) that imports, builds the stream's ten template
batches and opens the store, then resets the kernel's peak-RSS mark and does one thing:

- ``stream``: ``ia.publish`` of the reader (staged under the default 256 MB, every guard);
- ``raw stream``: the engine's own streaming ingest of the same reader, as one transaction or
  commit: DuckDB ``DELETE`` + ``INSERT ... SELECT`` from the reader, PostgreSQL ``DELETE`` +
  ADBC's ``adbc_ingest`` (binary COPY), Delta Lake ``write_deltalake(mode='overwrite',
  predicate=<the day>)`` of the reader with the day column the table is partitioned by;
- ``table``: the in-memory path, the same rows first read into one Arrow table (its peak holds
  the table), then ``ia.publish`` of it;
- ``load``: a streamed load of the window, as an input typed ``pa.RecordBatchReader`` gets it
  (the engine's reader drained into a Parquet file, under the default staging limit).

Peak RSS is the child's whole peak (``VmHWM``) after the reset: what a run worker needs. The
store holds another day and the target day's previous version, so each write replaces a day.
"""

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

import idem_assets as ia
from benchmarks import data
from benchmarks.bench_memory import _reset_peak, _status_kb
from benchmarks.harness import ROOT, Line, Scale
from idem_assets.lib.write.publish import spill_area
from idem_assets.lib.write.seam import Backend
from idem_assets.lib.write.streams import DEFAULT_MEMORY, memory_limited, to_parquet

#: (rows of the small and the large day, timed rounds) per scale; a warm-up round comes first
#: at the full scale. The tiny scale only proves the benchmark runs: one child per engine and
#: size does every mode in turn, as 48 fresh processes took four minutes of the suite.
SIZES: dict[Scale, tuple[tuple[int, int], int]] = {
    "tiny": ((20_000, 200_000), 1),
    "full": ((2_000_000, 20_000_000), 2),
}
ENGINES = ("duckdb", "postgres", "delta")
MODES = ("stream", "raw stream", "table", "load")
TEMPLATE_ROWS = 100_000
TEMPLATES = 10
TARGET_DAY = 1
OTHER_DAY = 0
#: The most a run worker may take at 20M rows, and how much more than at 2M.
LIMIT_MB = 1000.0
FLAT = 1.3


def templates() -> list[pa.RecordBatch]:
    """Ten 100,000-row batches of the target day, built once: the stream repeats them."""
    found = []
    for i in range(TEMPLATES):
        table = data.trips(TARGET_DAY, TEMPLATE_ROWS, first_id=i * TEMPLATE_ROWS, seed=i)
        found += table.combine_chunks().to_batches()
    return found


def source(parts: list[pa.RecordBatch], rows: int) -> pa.RecordBatchReader:
    """``rows`` trips of the day as a reader: the templates again and again, new ids each time."""
    schema = parts[0].schema

    def batches() -> Iterator[pa.RecordBatch]:
        sent = 0
        while sent < rows:
            part = parts[(sent // TEMPLATE_ROWS) % len(parts)]
            lap = sent // (TEMPLATE_ROWS * len(parts))
            ids = pc.add(part.column(0), pa.scalar(lap * TEMPLATE_ROWS * len(parts), pa.int64()))
            batch = part.set_column(0, data.KEY, ids)
            take = min(batch.num_rows, rows - sent)
            yield batch.slice(0, take)
            sent += take

    return pa.RecordBatchReader.from_batches(schema, batches())


class Store:
    """One engine's store under ``where``: a backend to publish through and the raw ingest."""

    def __init__(self, engine: str, where: dict[str, Any]) -> None:
        self.engine, self.where = engine, where

    def backend(self) -> AbstractContextManager[Backend]:
        if self.engine == "duckdb":
            return _duckdb(self.where["database"])
        if self.engine == "postgres":
            from idem_assets.lib.backends.postgres.backend import PostgresBackend

            return PostgresBackend.connect(_location(self.where))
        from idem_assets.lib.backends.delta.backend import DeltaBackend

        return DeltaBackend(self.where["root"])

    def raw(self, reader: pa.RecordBatchReader) -> None:
        """The engine's own streaming ingest of ``reader`` over the day, in one transaction."""
        start, end = data.day_bounds(TARGET_DAY)
        window = f"{data.PARTITION_COLUMN} >= $1 AND {data.PARTITION_COLUMN} < $2"
        if self.engine == "duckdb":
            conn = duckdb.connect(self.where["database"])
            conn.register("raw_stream", reader)
            conn.execute("BEGIN")
            conn.execute(f"DELETE FROM main.{data.TABLE} WHERE {window}", [start, end])
            conn.execute(f"INSERT INTO main.{data.TABLE} SELECT * FROM raw_stream")
            conn.execute("COMMIT")
            conn.close()
        elif self.engine == "postgres":
            import adbc_driver_postgresql.dbapi as adbc

            with adbc.connect(_location(self.where).conninfo()) as conn, conn.cursor() as cur:
                cur.execute(f"DELETE FROM main.{data.TABLE} WHERE {window}", [start, end])
                cur.adbc_ingest(data.TABLE, reader, mode="append", db_schema_name="main")
                conn.commit()
        else:
            from deltalake import write_deltalake

            from benchmarks.bench_delta import raw_window
            from idem_assets.lib.backends.delta.layout import with_day

            laid_out = pa.RecordBatchReader.from_batches(
                with_day(reader.schema.empty_table(), data.PARTITION_COLUMN).schema,
                (
                    b
                    for part in reader
                    for b in with_day(
                        pa.Table.from_batches([part]), data.PARTITION_COLUMN
                    ).to_batches()
                ),
            )
            uri = f"{self.where['root']}/main/{data.TABLE}"
            write_deltalake(uri, laid_out, mode="overwrite", predicate=raw_window(TARGET_DAY))


@contextmanager
def _duckdb(database: str) -> Iterator[Backend]:
    from idem_assets.lib.backends.duckdb.backend import DuckDBBackend

    conn = duckdb.connect(database)
    try:
        yield DuckDBBackend(conn)
    finally:
        conn.close()


def _location(where: dict[str, Any]) -> Any:
    from idem_assets.lib.backends.postgres.backend import PostgresLocation

    return PostgresLocation(
        where["host"], where["port"], where["user"], where["database"], where["password"]
    )


def child(engine: str, modes: list[str], rows: int, where: dict[str, Any]) -> list[dict[str, Any]]:
    """Do each of ``modes`` once in this process; wall and CPU seconds and peak RSS of each."""
    store = Store(engine, where)
    parts = templates()
    window = data.window([TARGET_DAY])
    # One small publish first, into a table of its own: the library's one-time costs in a
    # process (its embedded DuckDB, statements compiled once) are not the batch's.
    warm = _warm_settings()
    with store.backend() as backend:
        first = pa.Table.from_batches(parts[:1]).slice(0, 1000)
        ia.publish(backend, source(parts[:1], 1000), warm, window, now=data.NOW)
        ia.publish(backend, first, warm, window, now=data.NOW)
    return [_once(store, parts, mode, rows) for mode in modes]


def _once(store: Store, parts: list[pa.RecordBatch], mode: str, rows: int) -> dict[str, Any]:
    """Do ``mode`` once: its wall and CPU seconds, the peak RSS from its start, the day stored."""
    settings = data.settings("overwrite")
    window = data.window([TARGET_DAY])
    reset = _reset_peak()
    cpu, start = time.process_time(), time.perf_counter()
    if mode == "stream":
        with store.backend() as backend:
            ia.publish(backend, source(parts, rows), settings, window, now=data.NOW)
    elif mode == "raw stream":
        store.raw(source(parts, rows))
    elif mode == "table":
        table = source(parts, rows).read_all()
        start = time.perf_counter()
        with store.backend() as backend:
            ia.publish(backend, table, settings, window, now=data.NOW)
    else:
        # As the IO manager loads a streamed input: under the staging limit where it sorts.
        with store.backend() as backend, memory_limited(spill_area(backend).conn, DEFAULT_MEMORY):
            reader = backend.load(settings, window, stream=True)
            assert isinstance(reader, pa.RecordBatchReader)
            path = Path(to_parquet(reader))
        path.unlink()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    peak = _status_kb("VmHWM") if reset else None
    if peak is None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with store.backend() as backend:
        stored = ia.table_fingerprint(backend, "main", data.TABLE, data.PARTITION_COLUMN, window)
    return {"wall": wall, "cpu": cpu, "peak_mb": peak * 1024 / 1e6, "stored": stored}


def _warm_settings() -> ia.WriteSettings:
    """The settings of a scratch table the child warms the library up on."""
    from tests import helpers

    md = {"partition_expr": data.PARTITION_COLUMN, "primary_key": [data.KEY]}
    return helpers.settings("overwrite", md, table="warm")


def _spawn(
    engine: str, modes: tuple[str, ...], rows: int, where: dict[str, Any]
) -> list[dict[str, Any]]:
    found = subprocess.run(
        [
            *(sys.executable, "-m", "benchmarks.bench_streams", "--child", ",".join(modes)),
            *("--engine", engine, "--rows", str(rows), "--where", json.dumps(where)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if found.returncode:
        raise RuntimeError(f"{engine} {modes} {rows:,} rows failed:\n{found.stderr[-3000:]}")
    return json.loads(found.stdout.strip().splitlines()[-1])


def _prepare(engine: str, workdir: Path, server: Any) -> dict[str, Any]:
    """A store holding another day, through our publish (so both sides get its layout)."""
    if engine == "duckdb":
        where: dict[str, Any] = {"database": str(workdir / "streams.duckdb")}
    elif engine == "postgres":
        server.create_database("streams")
        where = {
            "host": server.host,
            "port": server.port,
            "user": server.user,
            "database": "streams",
            "password": server.password,
        }
    else:
        where = {"root": str(workdir / "lake")}
    with Store(engine, where).backend() as backend:
        other = data.trips(OTHER_DAY, TEMPLATE_ROWS)
        ia.publish(
            backend, other, data.settings("overwrite"), data.window([OTHER_DAY]), now=data.NOW
        )
    return where


def run(scale: Scale, repeat: int | None, workdir: Path) -> list[Line]:
    """Per engine and size: a warm-up, then rounds of every mode in flipping order."""
    from tests.postgres_server import PostgresServer

    (small, large), rounds = SIZES[scale]
    lines: list[Line] = []
    with PostgresServer.start() as server:
        for engine in ENGINES:
            where = _prepare(engine, workdir, server)
            found: dict[tuple[int, str], list[dict[str, Any]]] = {}
            for rows in (small, large):
                if scale == "tiny":
                    for mode, result in zip(MODES, _spawn(engine, MODES, rows, where), strict=True):
                        found[(rows, mode)] = [result]
                    continue
                for r in range(1 + (repeat or rounds)):
                    modes = MODES if r % 2 == 0 else tuple(reversed(MODES))
                    for mode in modes:
                        # A fresh process each: memory a mode freed stays in the allocator.
                        result = _spawn(engine, (mode,), rows, where)[0]
                        if r:
                            found.setdefault((rows, mode), []).append(result)
            lines += _lines(engine, found, small, large)
    return lines


def _label(rows: int) -> str:
    return f"{rows // 1_000_000}M rows" if rows >= 1_000_000 else f"{rows // 1000}k rows"


def _lines(
    engine: str, found: dict[tuple[int, str], list[dict[str, Any]]], small: int, large: int
) -> list[Line]:
    def values(rows: int, mode: str, what: str) -> list[float]:
        return [r[what] for r in found[(rows, mode)]]

    bench = f"12 streams {engine}"

    def equal(rows: int) -> bool:
        """Whether every write of ``rows`` left the same day (count and hash sum)."""
        written = [r["stored"] for (n, mode), rs in found.items() if n == rows for r in rs]
        return len(set(written)) == 1

    lines = [
        Line(
            bench,
            f"{_label(large)} vs {_label(small)}, streamed publish",
            f"peak RSS at {_label(large)}",
            f"peak RSS at {_label(small)}",
            values(large, "stream", "peak_mb"),
            values(small, "stream", "peak_mb"),
            unit="MB",
            target=("<=", FLAT),
        ),
        Line(
            bench,
            f"{_label(large)}, streamed publish",
            "peak RSS",
            "1 GB",
            values(large, "stream", "peak_mb"),
            [LIMIT_MB] * len(found[(large, "stream")]),
            unit="MB",
            target=("<=", 1.0),
        ),
    ]
    for rows in (small, large):
        lines.append(
            Line(
                bench,
                f"{_label(rows)}, streamed publish",
                "publish of the stream",
                "raw streaming ingest",
                values(rows, "stream", "wall"),
                values(rows, "raw stream", "wall"),
                a_cpu=values(rows, "stream", "cpu"),
                b_cpu=values(rows, "raw stream", "cpu"),
                target=("<=", 1.3) if rows == large else None,
                equal=equal(rows),
            )
        )
    lines += [
        Line(
            bench,
            f"{_label(large)}, in-memory path",
            "peak RSS, one Arrow table",
            "peak RSS, streamed",
            values(large, "table", "peak_mb"),
            values(large, "stream", "peak_mb"),
            unit="MB",
        ),
        Line(
            bench,
            f"{_label(large)}, in-memory path",
            "publish of one Arrow table",
            "publish of the stream",
            values(large, "table", "wall"),
            values(large, "stream", "wall"),
            a_cpu=values(large, "table", "cpu"),
            b_cpu=values(large, "stream", "cpu"),
        ),
        Line(
            bench,
            f"{_label(large)} vs {_label(small)}, streamed load",
            f"peak RSS at {_label(large)}",
            f"peak RSS at {_label(small)}",
            values(large, "load", "peak_mb"),
            values(small, "load", "peak_mb"),
            unit="MB",
            target=("<=", FLAT),
        ),
        Line(
            bench,
            f"{_label(large)}, streamed load",
            "peak RSS",
            "1 GB",
            values(large, "load", "peak_mb"),
            [LIMIT_MB] * len(found[(large, "load")]),
            unit="MB",
            target=("<=", 1.0),
        ),
    ]
    lines[0].notes.append(
        "peak RSS of the whole child process after imports, the stream's templates and an open"
        " store; the stream is a RecordBatchReader of 100,000-row batches (8 columns, about 60"
        " bytes a row as Arrow); staging under the default 256 MB"
    )
    lines[2].notes.append(
        "raw: the engine's own streaming ingest of the same reader in one transaction or commit"
        " (DuckDB DELETE + INSERT from the reader, PostgreSQL DELETE + ADBC binary COPY, Delta"
        " write_deltalake(mode='overwrite', predicate=<the day>)); ours reads the stream once"
        " into DuckDB, runs every guard there, then streams the staged rows into the engine"
        " (DuckDB: into the table itself; Delta Lake: as the table's own Parquet file, which"
        " the commit adds)"
    )
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", required=True, help="modes, comma-separated: " + ",".join(MODES))
    parser.add_argument("--engine", choices=ENGINES, required=True)
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--where", required=True)
    args = parser.parse_args()
    modes = args.child.split(",")
    if not set(modes) <= set(MODES):
        parser.error(f"--child takes modes among {MODES}, comma-separated; got {args.child!r}")
    print(json.dumps(child(args.engine, modes, args.rows, json.loads(args.where))))
