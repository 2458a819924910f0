"""8. The Postgres backend vs raw SQL on the same server, and vs what users write instead.

Starts its own throwaway PostgreSQL (tests/postgres_server.py), one database per side, so the
sides never share a table. Raw SQL runs over the same ADBC driver: the fastest way there is to
put an Arrow table into PostgreSQL, binary COPY.
"""

from collections.abc import Callable
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path

import adbc_driver_postgresql.dbapi as adbc
import pyarrow as pa
import sqlalchemy as sa

import idem_assets as ia
from benchmarks import data
from benchmarks.bench_merge import merge_batch, merge_lines
from benchmarks.harness import Case, Line, Scale, interleave, line_from_times
from idem_assets.lib.backends.postgres.backend import PostgresBackend, PostgresLocation
from tests.postgres_server import PostgresServer

#: Per scale: (rows of the overwrite, rounds), (rows of the to_sql comparison, rounds),
#: (partitions x rows of the merge's table, rounds).
SIZES: dict[Scale, tuple[tuple[int, int], tuple[int, int], tuple[int, int, int]]] = {
    "tiny": ((2_000, 1), (1_000, 1), (4, 1_000, 1)),
    "full": ((1_000_000, 7), (100_000, 3), (30, 100_000, 9)),
}
OTHER_PARTITIONS = 4
TARGET_DAY = OTHER_PARTITIONS
TARGET = f"main.{data.TABLE}"
WINDOW = f"{data.PARTITION_COLUMN} >= $1 AND {data.PARTITION_COLUMN} < $2"
KEYS = data.KEY
RAW = "raw BEGIN; DELETE; COPY; COMMIT"


class Side:
    """One database of the server, with a held ADBC connection for raw SQL."""

    def __init__(self, server: PostgresServer, name: str) -> None:
        server.create_database(name)
        self.server, self.name = server, name
        self.location = PostgresLocation(
            server.host, server.port, server.user, name, server.password
        )
        self.conn = adbc.connect(self.location.conninfo())
        self.cur = self.conn.cursor()

    def close(self) -> None:
        self.cur.close()
        self.conn.close()

    def load(self, days: list[pa.Table], settings: ia.WriteSettings) -> None:
        """Create the table ``settings``' publish creates, COPY ``days`` in, then VACUUM.

        Every side of a comparison gets the same table: its columns and its indexes (on the
        partition column; a merge's also a BRIN on the key).
        """
        with PostgresBackend.connect(self.location) as backend:
            ia.publish(backend, days[0], settings, _window(days[0]), now=data.NOW)
        for day in days[1:]:
            self.cur.adbc_ingest(data.TABLE, day, mode="append", db_schema_name="main")
        self.conn.commit()
        self.vacuum()

    def vacuum(self) -> None:
        """Reclaim the last round's dead rows, so no round pays for another's (untimed)."""
        self.server.psql(f"VACUUM ANALYZE {TARGET}", self.name)

    def fingerprint(self) -> str | None:
        with PostgresBackend.connect(self.location) as backend:
            return ia.table_fingerprint(backend, "main", data.TABLE)


def _window(day: pa.Table) -> ia.WriteWindow:
    first: datetime = day.column(data.PARTITION_COLUMN)[0].as_py()
    return data.window([(first.date() - data.FIRST_DAY).days])


def raw_overwrite(side: Side, batch: pa.Table, bounds: list[datetime]) -> None:
    """``BEGIN; DELETE window; COPY batch; COMMIT``, the floor for any overwrite."""
    side.cur.execute(f"DELETE FROM {TARGET} WHERE {WINDOW}", bounds)
    side.cur.adbc_ingest(data.TABLE, batch, mode="append", db_schema_name="main")
    side.conn.commit()


def raw_merge_distinct_on(side: Side, batch: pa.Table, bounds: list[datetime]) -> None:
    """COPY into a temp table, DELETE the window, INSERT the winners by DISTINCT ON."""
    side.cur.adbc_ingest("raw_batch", batch, mode="create", temporary=True)
    side.cur.execute(f"DELETE FROM {TARGET} WHERE {WINDOW}", bounds)
    side.cur.execute(
        f"INSERT INTO {TARGET} SELECT DISTINCT ON ({KEYS}) * FROM raw_batch"
        f" ORDER BY {KEYS}, updated_at DESC"
    )
    side.cur.execute("DROP TABLE raw_batch")
    side.conn.commit()


def raw_merge_on_conflict(side: Side, batch: pa.Table, bounds: list[datetime]) -> None:
    """With a unique index: upsert the winners ON CONFLICT, delete the window's stale rows."""
    columns = [c for c in batch.column_names if c != KEYS]
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns)
    side.cur.adbc_ingest("raw_batch", batch, mode="create", temporary=True)
    side.cur.execute(
        f"INSERT INTO {TARGET} SELECT DISTINCT ON ({KEYS}) * FROM raw_batch"
        f" ORDER BY {KEYS}, updated_at DESC ON CONFLICT ({KEYS}) DO UPDATE SET {updates}"
    )
    side.cur.execute(
        f"DELETE FROM {TARGET} t WHERE t.{WINDOW}"
        f" AND NOT EXISTS (SELECT 1 FROM raw_batch b WHERE b.{KEYS} = t.{KEYS})",
        bounds,
    )
    side.cur.execute("DROP TABLE raw_batch")
    side.conn.commit()


def to_sql_overwrite(engine: sa.Engine, frame: object, bounds: list[datetime]) -> None:
    """What users write instead: DELETE the window, then ``DataFrame.to_sql`` (one transaction)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                f"DELETE FROM {TARGET} WHERE {data.PARTITION_COLUMN} >= :s"
                f" AND {data.PARTITION_COLUMN} < :e"
            ),
            {"s": bounds[0], "e": bounds[1]},
        )
        frame.to_sql(data.TABLE, conn, schema="main", if_exists="append", index=False)  # type: ignore[attr-defined]


def run(scale: Scale, repeat: int | None, workdir: Path) -> list[Line]:
    """Overwrite, merge and the to_sql comparison on one throwaway server."""
    (rows, rounds), (small, small_rounds), merge_size = SIZES[scale]
    with PostgresServer.start() as server:
        lines = _overwrite(server, rows, repeat or rounds, "8 postgres overwrite")
        lines += _to_sql(server, small, repeat or small_rounds)
        lines += _merge(server, *merge_size[:2], repeat or merge_size[2])
    return lines


def _label(rows: int) -> str:
    return f"{rows // 1_000_000}M rows" if rows >= 1_000_000 else f"{rows // 1_000}k rows"


def _publish(
    stack: ExitStack, side: Side, batch: pa.Table, settings: ia.WriteSettings
) -> Callable[[], ia.PublishResult]:
    """A publish on a connection held across rounds, as the raw side holds its own."""
    window = _window(batch)
    backend = stack.enter_context(PostgresBackend.connect(side.location))
    return lambda: ia.publish(backend, batch, settings, window, now=data.NOW)


def _overwrite(server: PostgresServer, rows: int, rounds: int, bench: str) -> list[Line]:
    batch = data.trips(TARGET_DAY, rows)
    setup = [data.trips(d, rows, seed=1) for d in range(OTHER_PARTITIONS + 1)]
    bounds = list(data.day_bounds(TARGET_DAY))
    ours, raw = Side(server, f"ow_ours_{rows}"), Side(server, f"ow_raw_{rows}")
    try:
        ours.load(setup, data.settings())
        raw.load(setup, data.settings())
        with ExitStack() as stack:
            publish = _publish(stack, ours, batch, data.settings("overwrite"))
            times = interleave(
                [
                    Case("publish", publish, prepare=ours.vacuum),
                    Case(RAW, lambda: raw_overwrite(raw, batch, bounds), prepare=raw.vacuum),
                ],
                rounds,
            )
        equal = ours.fingerprint() == raw.fingerprint()
    finally:
        ours.close()
        raw.close()
    label = _label(rows)
    return [
        line_from_times(
            bench,
            label,
            times,
            "publish",
            RAW,
            target=("<=", 1.3),
            equal=equal,
            notes=[
                f"{label} ({batch.nbytes / 1e6:.0f} MB Arrow) over the old version of the day in"
                f" a table holding {OTHER_PARTITIONS} other days; publish runs every guard, the"
                " advisory locks, the owners check and the per-day fingerprint (hashed in DuckDB);"
                " both sides COPY"
                " through the ADBC driver; VACUUM ANALYZE (untimed) before each round"
            ],
        )
    ]


def _to_sql(server: PostgresServer, rows: int, rounds: int) -> list[Line]:
    batch = data.trips(TARGET_DAY, rows)
    frame = batch.to_pandas()
    setup = [data.trips(d, rows, seed=1) for d in range(OTHER_PARTITIONS + 1)]
    bounds = list(data.day_bounds(TARGET_DAY))
    ours, users = Side(server, f"ts_ours_{rows}"), Side(server, f"ts_users_{rows}")
    engine = sa.create_engine(server.url(users.name))
    try:
        ours.load(setup, data.settings())
        users.load(setup, data.settings())
        with ExitStack() as stack:
            publish = _publish(stack, ours, batch, data.settings("overwrite"))
            times = interleave(
                [
                    Case("publish", publish, prepare=ours.vacuum),
                    Case(
                        "DELETE + DataFrame.to_sql",
                        lambda: to_sql_overwrite(engine, frame, bounds),
                        prepare=users.vacuum,
                    ),
                ],
                rounds,
            )
        equal = ours.fingerprint() == users.fingerprint()
    finally:
        engine.dispose()
        ours.close()
        users.close()
    label = _label(rows)
    return [
        line_from_times(
            "8 postgres vs to_sql",
            label,
            times,
            "DELETE + DataFrame.to_sql",
            "publish",
            target=(">=", 5.0),
            equal=equal,
            notes=[
                f"{label}: pandas to_sql (SQLAlchemy + psycopg2, its defaults: an INSERT per row"
                " in executemany) after a DELETE of the window, in one transaction, against"
                " publish with every guard; A/B is how many times faster publish is"
            ],
        )
    ]


def _merge(server: PostgresServer, partitions: int, rows: int, rounds: int) -> list[Line]:
    day = partitions // 2
    days = [data.trips(d, rows, seed=1) for d in range(partitions)]
    current = days[day]
    batch, counts = merge_batch(day, current)
    bounds = list(data.day_bounds(day))
    settings = data.settings("merge", dedupe_order_by=["updated_at"])
    names = ["publish (merge)", "raw COPY + DELETE + INSERT DISTINCT ON", "raw ON CONFLICT"]
    sides = {n: Side(server, f"merge_{i}") for i, n in enumerate(names)}
    try:
        for side in sides.values():
            side.load(days, settings)
        sides[names[2]].cur.execute(f"CREATE UNIQUE INDEX ON {TARGET} ({KEYS})")
        sides[names[2]].conn.commit()

        def restore(side: Side) -> Callable[[], None]:
            def run() -> None:
                raw_overwrite(side, current, bounds)
                side.vacuum()

            return run

        with ExitStack() as stack:
            results: list[ia.PublishResult] = []
            publish = _publish(stack, sides[names[0]], batch, settings)
            runs: dict[str, Callable[[], object]] = {
                names[0]: lambda: results.append(publish()),
                names[1]: lambda: raw_merge_distinct_on(sides[names[1]], batch, bounds),
                names[2]: lambda: raw_merge_on_conflict(sides[names[2]], batch, bounds),
            }
            # Verify before timing: all three leave exactly the same table.
            fingerprints = {}
            for name, fn in runs.items():
                fn()
                fingerprints[name] = sides[name].fingerprint()
            first = results[0]
            expected = (counts["updates"], counts["new"], counts["stale"])
            equal = len(set(fingerprints.values())) == 1 and (
                (first.updated, first.inserted, first.deleted) == expected
            )
            cases = [Case(n, runs[n], prepare=restore(sides[n])) for n in names]
            times = interleave(cases, rounds)
    finally:
        for side in sides.values():
            side.close()
    return merge_lines(
        "8 postgres merge",
        batch,
        counts,
        partitions * rows,
        times,
        names,
        equal,
        lambda raw, ln: (
            f"every side's table has the indexes the publish creates (a B-tree on"
            f" {data.PARTITION_COLUMN}, a BRIN on {KEYS}), the ON CONFLICT side also a unique"
            f" one on {KEYS}"
        ),
    )
