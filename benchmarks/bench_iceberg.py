"""9. Apache Iceberg: publish and merge through the Iceberg backend vs raw pyiceberg.

The overwrite is compared with ``table.overwrite(df, overwrite_filter=<the day>)``; the merge (an
upsert: matched keys updated, new keys inserted) with pyiceberg's fastest public delete + append,
``tx.delete(And(<the day>, In(key, keys)))`` then ``tx.append(batch)`` in one transaction, and,
run once, with ``table.upsert(batch, join_cols=[key])``. Every table lives in a SQLite catalog of
its own, partitioned by the day of ``pickup_at`` as the backend partitions its tables.
"""

import os
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import And, In
from pyiceberg.table import Table

import idem_assets as ia
from benchmarks import data
from benchmarks.harness import Case, Line, Scale, interleave, line_from_times
from idem_assets.lib.backends.iceberg.backend import IcebergBackend
from idem_assets.lib.backends.iceberg.catalog import IcebergLocation
from idem_assets.lib.backends.iceberg.expressions import region_filter
from idem_assets.lib.model.windows import region_for

#: Rows of the overwritten day, other days in the table, rounds.
OVERWRITE: dict[Scale, tuple[int, int, int]] = {"tiny": (10_000, 2, 2), "full": (1_000_000, 2, 5)}
#: Days in the table, rows per day, updated and new rows of the batch, rounds.
MERGE: dict[Scale, tuple[int, int, int, int, int]] = {
    "tiny": (10, 2_000, 1_000, 1_020, 2),
    "full": (30, 100_000, 50_000, 51_000, 5),
}
TYPES = {data.PARTITION_COLUMN: pa.timestamp("us")}


def day_filter(day: int):
    """The day as the row filter the backend builds: ``>= start AND < end`` on pickup_at."""
    region = region_for(data.window([day]), (("", data.PARTITION_COLUMN),), TYPES)
    return region_filter(region, TYPES)


def publish(
    location: IcebergLocation, batch: pa.Table, settings: ia.WriteSettings, day: int
) -> ia.PublishResult:
    """One publish of ``day`` through the Iceberg backend."""
    with IcebergBackend(location) as backend:
        return ia.publish(backend, batch, settings, data.window([day]), now=data.NOW)


def table(location: IcebergLocation) -> Table:
    """The benchmark's table, loaded now."""
    with IcebergBackend(location) as backend:
        return backend.catalog.load_table(("main", data.TABLE))


def setup(location: IcebergLocation, days: list[pa.Table]) -> None:
    """Every day written through the backend (which creates the table and its spec)."""
    for day, rows in enumerate(days):
        publish(location, rows, data.settings("overwrite"), day)


def fingerprint(location: IcebergLocation) -> str | None:
    """The whole table's fingerprint."""
    with IcebergBackend(location) as backend:
        return ia.table_fingerprint(backend, "main", data.TABLE)


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages."""
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def run(scale: Scale, repeat: int | None, workdir: Path) -> list[Line]:
    """The overwrite and the merge, each against raw pyiceberg."""
    return [*_overwrite(scale, repeat, workdir), *_merge(scale, repeat, workdir)]


def _overwrite(scale: Scale, repeat: int | None, workdir: Path) -> list[Line]:
    rows, others, rounds = OVERWRITE[scale]
    day = others
    days = [data.trips(d, rows, seed=1) for d in range(others + 1)]
    batch = data.trips(day, rows)
    ours, raw = (IcebergLocation.local(workdir / f"overwrite_{n}") for n in ("ours", "raw"))
    setup(ours, days)
    setup(raw, days)
    settings = data.settings("overwrite")
    load = loadavg()
    names = ["publish (Iceberg)", "raw table.overwrite(filter)"]
    times = interleave(
        [
            Case(names[0], lambda: publish(ours, batch, settings, day)),
            Case(names[1], lambda: table(raw).overwrite(batch, overwrite_filter=day_filter(day))),
        ],
        repeat or rounds,
    )
    equal = fingerprint(ours) == fingerprint(raw)
    label = f"{rows / 1e6:g}M rows" if rows >= 1_000_000 else f"{rows // 1_000}k rows"
    snapshots = len(table(raw).snapshots()) - len(table(ours).snapshots())
    return [
        line_from_times(
            "9 Iceberg overwrite",
            label,
            times,
            names[0],
            names[1],
            target=("<=", 1.3),
            equal=equal,
            notes=[
                f"one day of {label} replaced in an Iceberg table (SQLite catalog, local"
                f" warehouse) holding {others} other days; raw: table.overwrite(df,"
                " overwrite_filter=<the day>) of the same Arrow table; ours adds every guard, the"
                " fingerprint and the owner check, and writes one snapshot per publish where raw"
                f" writes two (a DELETE, then an APPEND: {snapshots} more snapshots over the"
                f" rounds); load average {load} before, {loadavg()} after"
            ],
        )
    ]


def upsert_batch(current: pa.Table, updates: int, new: int, day: int) -> pa.Table:
    """``updates`` of ``current``'s keys with a new fare, then ``new`` trips of ``day``."""
    updated = current.slice(0, updates)
    fare = updated.schema.get_field_index("fare")
    updated = updated.set_column(fare, "fare", pc.add(updated["fare"], 1.0))
    added = data.trips(day, new, first_id=current.num_rows, seed=2)
    return pa.concat_tables([updated, added]).combine_chunks()


def _merge(scale: Scale, repeat: int | None, workdir: Path) -> list[Line]:
    partitions, rows, updates, new, rounds = MERGE[scale]
    day = partitions // 2
    days = [data.trips(d, rows, seed=1) for d in range(partitions)]
    current = days[day]
    batch = upsert_batch(current, updates, new, day)
    keys = batch.column(data.KEY).to_pylist()
    ours, raw, upsert = (
        IcebergLocation.local(workdir / f"merge_{n}") for n in ("ours", "raw", "upsert")
    )
    for location in (ours, raw, upsert):
        setup(location, days)
    settings = data.settings("merge", delete_missing=False)
    results: list[ia.PublishResult] = []

    def ours_merge() -> None:
        results.append(publish(ours, batch, settings, day))

    def raw_merge() -> None:
        with table(raw).transaction() as tx:
            tx.delete(And(day_filter(day), In(data.KEY, keys)))
            tx.append(batch)

    def restore(location: IcebergLocation) -> Callable[[], None]:
        return lambda: table(location).overwrite(current, overwrite_filter=day_filter(day))

    load = loadavg()
    names = ["publish merge (Iceberg)", "raw tx.delete(day AND In keys)+append"]
    times = interleave(
        [
            Case(names[0], ours_merge, prepare=restore(ours)),
            Case(names[1], raw_merge, prepare=restore(raw)),
        ],
        repeat or rounds,
    )
    start = time.perf_counter()
    upserted = table(upsert).upsert(batch, join_cols=[data.KEY])
    upsert_s = time.perf_counter() - start
    first = results[0]
    equal = (
        fingerprint(ours) == fingerprint(raw) == fingerprint(upsert)
        and (first.updated, first.inserted) == (updates, new)
        and (upserted.rows_updated, upserted.rows_inserted) == (updates, new)
    )
    label = f"{batch.num_rows:,} into {partitions * rows / 1e6:g}M"
    raw_line = line_from_times(
        "9 Iceberg merge",
        label,
        times,
        names[0],
        names[1],
        target=("<=", 1.3),
        equal=equal,
        notes=[
            f"batch {batch.num_rows:,} rows of one day ({updates:,} updates, {new:,} new) into"
            f" {partitions * rows:,} rows over {partitions} days; raw: pyiceberg's fastest"
            " public delete + append, tx.delete(And(<the day>, In(trip_id, keys))) then"
            " tx.append(batch) in one transaction (two snapshots); ours reads only the day's"
            " files whose trip_id bounds hold a key of the batch and writes one snapshot;"
            f" load average {load} before, {loadavg()} after"
        ],
    )
    upsert_line = Line(
        "9 Iceberg merge",
        label,
        names[0],
        "table.upsert(batch, join_cols)",
        times[names[0]].wall,
        [upsert_s],
        a_cpu=times[names[0]].cpu,
        equal=equal,
        notes=[
            f"pyiceberg's own upsert, run once ({upsert_s:.1f} s, {upserted.rows_updated:,}"
            f" updated and {upserted.rows_inserted:,} inserted): it binds an In of every key"
            " several times and compares matched rows one at a time in Python; load average"
            f" {loadavg()} after it"
        ],
    )
    return [raw_line, upsert_line]
