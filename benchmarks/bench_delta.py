"""7. Delta Lake: publish and merge through the Delta backend vs the raw deltalake calls."""

from collections.abc import Callable
from pathlib import Path

import dagster as dg
import duckdb
import pyarrow as pa
from dagster_deltalake import DeltaLakePyarrowIOManager, LocalConfig
from deltalake import DeltaTable, write_deltalake

import idem_assets as ia
from benchmarks import data
from benchmarks.bench_merge import DEDUPE, merge_batch
from benchmarks.harness import Case, Line, Scale, interleave, line_from_times
from idem_assets.lib.backends.delta.backend import DeltaBackend
from idem_assets.lib.backends.delta.layout import DAY_COLUMN as DAY
from idem_assets.lib.backends.delta.layout import literal, window_predicate, with_day

#: Rows of the overwritten day, rounds; the table holds OTHER_PARTITIONS more days.
OVERWRITE: dict[Scale, tuple[int, int]] = {"tiny": (10_000, 2), "full": (1_000_000, 7)}
#: Partitions in the table, rows per partition, rounds; the merge batch is one partition.
MERGE: dict[Scale, tuple[int, int, int]] = {"tiny": (10, 2_000, 2), "full": (30, 100_000, 7)}
OTHER_PARTITIONS = 4
TIMESTAMP = pa.timestamp("us")


def raw_window(day: int, alias: str = "") -> str:
    """The day as the raw calls write it: ``>= start AND < end``, typed literals."""
    start, end = data.day_bounds(day)
    col = f"{alias}.{data.PARTITION_COLUMN}" if alias else data.PARTITION_COLUMN
    return f"{col} >= {literal(start, TIMESTAMP)} AND {col} < {literal(end, TIMESTAMP)}"


def fingerprint(root: str) -> str | None:
    """The table's fingerprint, however it is laid out (the derived day column left out)."""
    with DeltaBackend(root) as backend:
        return ia.table_fingerprint(backend, "main", data.TABLE)


def setup(root: str, days: list[pa.Table], raw: bool, partitioned: bool = False) -> None:
    """Write the days: in one publish (ours), or plainly, one append per day (raw).

    The raw table is unpartitioned (a file per day, as daily runs leave it, so the predicate
    prunes by file statistics), or partitioned by the same derived day column as ours.
    """
    if raw:
        uri = f"{root}/main/{data.TABLE}"
        for day in days:
            if partitioned:
                day = with_day(day, data.PARTITION_COLUMN)
                write_deltalake(uri, day, mode="append", partition_by=[DAY])
            else:
                write_deltalake(uri, day, mode="append")
        return
    window = data.window(list(range(len(days))))
    with DeltaBackend(root) as backend:
        ia.publish(backend, pa.concat_tables(days), data.settings(), window, now=data.NOW)


def publish(root: str, batch: pa.Table, settings: ia.WriteSettings, day: int) -> None:
    """One publish of ``day`` through the Delta backend."""
    with DeltaBackend(root) as backend:
        ia.publish(backend, batch, settings, data.window([day]), now=data.NOW)


def raw_overwrite(root: str, batch: pa.Table, day: int, partitioned: bool = False) -> None:
    """The baseline: ``write_deltalake(mode='overwrite', predicate=<the day>)``."""
    uri = f"{root}/main/{data.TABLE}"
    if partitioned:
        batch = with_day(batch, data.PARTITION_COLUMN)
    write_deltalake(uri, batch, mode="overwrite", predicate=raw_window(day))


def raw_merge(root: str, batch: pa.Table, day: int, partitioned: bool = False) -> None:
    """The baseline: dedupe with DuckDB, then one ``DeltaTable.merge`` scoped to the day."""
    with duckdb.connect() as conn:
        conn.register("raw_batch", batch)
        source = conn.sql(f"SELECT * FROM raw_batch {DEDUPE}").to_arrow_table()
    window = raw_window(day, "t")
    if partitioned:
        source = with_day(source, data.PARTITION_COLUMN)
        start, end = data.day_bounds(day)
        window = window_predicate(data.PARTITION_COLUMN, TIMESTAMP, [(start, end)], "t")
    table = DeltaTable(f"{root}/main/{data.TABLE}")
    (
        table.merge(
            source, f"t.{data.KEY} = s.{data.KEY} AND {window}", source_alias="s", target_alias="t"
        )
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .when_not_matched_by_source_delete(window)
        .execute()
    )


def _restore(root: str, current: pa.Table, day: int, partitioned: bool) -> Callable[[], None]:
    def restore() -> None:
        uri = f"{root}/main/{data.TABLE}"
        batch = with_day(current, data.PARTITION_COLUMN) if partitioned else current
        write_deltalake(uri, batch, mode="overwrite", predicate=raw_window(day))

    return restore


def run(scale: Scale, repeat: int | None, workdir: Path) -> list[Line]:
    """The overwrite and the merge, each against its raw deltalake call."""
    return [
        *_overwrite(scale, repeat, workdir),
        *_merge(scale, repeat, workdir),
        _against_dagster_deltalake(scale, repeat, workdir),
    ]


def _overwrite(scale: Scale, repeat: int | None, workdir: Path) -> list[Line]:
    rows, rounds = OVERWRITE[scale]
    day = OTHER_PARTITIONS
    batch = data.trips(day, rows)
    days = [data.trips(d, rows, seed=1) for d in range(OTHER_PARTITIONS + 1)]
    ours, raw, flat = (str(workdir / f"overwrite_{n}") for n in ("ours", "raw", "flat"))
    setup(ours, days, raw=False)
    setup(raw, days, raw=True, partitioned=True)
    setup(flat, days, raw=True)
    settings = data.settings("overwrite")
    names = ["publish (Delta)", "raw write_deltalake", "raw, unpartitioned"]
    times = interleave(
        [
            Case(names[0], lambda: publish(ours, batch, settings, day)),
            Case(names[1], lambda: raw_overwrite(raw, batch, day, partitioned=True)),
            Case(names[2], lambda: raw_overwrite(flat, batch, day)),
        ],
        repeat or rounds,
    )
    equal = fingerprint(ours) == fingerprint(raw) == fingerprint(flat)
    label = f"{rows / 1e6:g}M rows" if rows >= 1_000_000 else f"{rows // 1_000}k rows"
    same = line_from_times(
        "7 Delta overwrite",
        label,
        times,
        names[0],
        names[1],
        target=("<=", 1.3),
        equal=equal,
        notes=[
            f"one day of {label} replaced in a Delta table holding {OTHER_PARTITIONS} other"
            " days; raw: write_deltalake(mode='overwrite', predicate=<the day, typed>) of the"
            " same Arrow table (with the day column added) into a table partitioned by day as"
            " ours is; ours adds every guard, the fingerprint and the owner check"
        ],
    )
    layout = line_from_times(
        "7 Delta overwrite",
        label,
        times,
        names[0],
        names[2],
        equal=equal,
        notes=[
            "the same write into an unpartitioned table written one file per day: Delta writes"
            " a partitioned table more slowly; the partitions are what let writers of"
            " different days commit side by side (and a chunk's days land in their own files)"
        ],
    )
    return [same, layout]


def _merge(scale: Scale, repeat: int | None, workdir: Path) -> list[Line]:
    partitions, rows, rounds = MERGE[scale]
    day = partitions // 2
    days = [data.trips(d, rows, seed=1) for d in range(partitions)]
    current = days[day]
    batch, counts = merge_batch(day, current)
    ours, raw, flat = (str(workdir / f"merge_{n}") for n in ("ours", "raw", "flat"))
    setup(ours, days, raw=False)
    setup(raw, days, raw=True, partitioned=True)
    setup(flat, days, raw=True)
    settings = data.settings("merge", dedupe_order_by=["updated_at"])
    results: list[ia.PublishResult] = []

    def ours_merge() -> None:
        with DeltaBackend(ours) as backend:
            window = data.window([day])
            results.append(ia.publish(backend, batch, settings, window, now=data.NOW))

    names = ["publish merge (Delta)", "raw DeltaTable.merge", "raw, unpartitioned"]
    runs: dict[str, Callable[[], None]] = {
        names[0]: ours_merge,
        names[1]: lambda: raw_merge(raw, batch, day, partitioned=True),
        names[2]: lambda: raw_merge(flat, batch, day),
    }
    # Verify before timing: all three leave exactly the same table.
    for run_once in runs.values():
        run_once()
    first = results[0]
    expected = (counts["updates"], counts["new"], counts["stale"])
    equal = fingerprint(ours) == fingerprint(raw) == fingerprint(flat) and (
        (first.updated, first.inserted, first.deleted) == expected
    )
    roots = dict(zip(names, (ours, raw, flat), strict=True))
    cases = [
        Case(n, runs[n], prepare=_restore(roots[n], current, day, n != names[2])) for n in names
    ]
    times = interleave(cases, repeat or rounds)
    table_rows = partitions * rows
    label = f"{batch.num_rows:,} into {table_rows / 1e6:g}M"
    same = line_from_times(
        "7 Delta merge",
        label,
        times,
        names[0],
        names[1],
        target=("<=", 1.3),
        equal=equal,
        notes=[
            f"batch {batch.num_rows:,} rows ({counts['updates']:,} updates, {counts['new']:,}"
            f" new, {counts['duplicates']:,} losing duplicates; {counts['stale']:,} stale rows"
            f" deleted) into {table_rows:,}; raw: DuckDB QUALIFY dedupe, the day column added,"
            " then one DeltaTable.merge scoped to the day (update matched, insert new, delete"
            " the day's rows not in the batch) on a table partitioned by day as ours is"
        ],
    )
    layout = line_from_times(
        "7 Delta merge",
        label,
        times,
        names[0],
        names[2],
        equal=equal,
        notes=["the same merge into an unpartitioned table written one file per day"],
    )
    return [same, layout]


#: Rows per day and rounds of the dg.materialize comparison with dagster-deltalake.
MATERIALIZE: dict[Scale, tuple[int, int]] = {"tiny": (2_000, 2), "full": (100_000, 7)}
DATE_COLUMN = "pickup_date"


def dated_trips(day: int, rows: int, version: int = 0) -> pa.Table:
    """Trips with a DATE column naming their day: the partition column dagster-deltalake needs."""
    trips = data.trips(day, rows, seed=version)
    days = pa.array([data.day_bounds(day)[0].date()] * rows, pa.date32())
    return trips.append_column(DATE_COLUMN, days)


def dated_asset(rows: int, versions: dict[str, int], column: str) -> dg.AssetsDefinition:
    """A daily asset returning each day of its run, partitioned by ``column``."""

    @dg.asset(name=data.TABLE, partitions_def=data.DAILY, metadata={"partition_expr": column})
    def trips(context: dg.AssetExecutionContext) -> pa.Table:
        keys = context.partition_keys
        days = [data.DAILY.get_partition_keys().index(k) for k in keys]
        batch = pa.concat_tables([dated_trips(d, rows, versions["v"]) for d in days])
        if column == data.PARTITION_COLUMN:
            return batch.drop_columns([DATE_COLUMN])
        return batch

    return trips


def _materialize(
    asset: dg.AssetsDefinition, io_manager: dg.ConfigurableIOManager, *keys: str
) -> bool:
    tags = {}
    if len(keys) > 1:
        tags = {
            "dagster/asset_partition_range_start": keys[0],
            "dagster/asset_partition_range_end": keys[-1],
        }
    result = dg.materialize(
        [asset],
        resources={"io_manager": io_manager},
        partition_key=keys[0] if len(keys) == 1 else None,
        tags=tags,
        raise_on_error=False,
    )
    return result.success


def _their_failures(workdir: Path) -> str:
    """What dagster-deltalake does on the cases it gets wrong, replayed on 10-row days."""
    versions = {"v": 0}
    keys = [data.partition_key(d) for d in range(3)]
    found = []
    for column in (data.PARTITION_COLUMN, DATE_COLUMN):
        for name, io_manager in _io_managers(workdir / f"failures_{column}").items():
            asset = dated_asset(10, versions, column)
            versions["v"] = 0
            for key in keys:
                _materialize(asset, io_manager, key)
            after_fill = _rows(io_manager)
            versions["v"] = 1
            ok = _materialize(asset, io_manager, *keys)
            found.append(
                f"{name}, {column} ({'TIMESTAMP' if column == data.PARTITION_COLUMN else 'DATE'}):"
                f" 3 days of 10 rows, one run each, leave {after_fill} rows; a run of the 3-day"
                f" range then {'succeeds' if ok else 'fails'} and leaves {_rows(io_manager)}"
            )
    return "; ".join(found)


def _io_managers(root: Path) -> dict[str, dg.ConfigurableIOManager]:
    return {
        "ours": ia.DeltaOverwriteIOManager(root=str(root / "ours")),
        "dagster-deltalake": DeltaLakePyarrowIOManager(
            root_uri=str(root / "theirs"), storage_options=LocalConfig(), schema="main"
        ),
    }


def _rows(io_manager: dg.ConfigurableIOManager) -> int:
    root = getattr(io_manager, "root", None) or getattr(io_manager, "root_uri", "")
    return DeltaTable(f"{root}/main/{data.TABLE}").count()


def _against_dagster_deltalake(scale: Scale, repeat: int | None, workdir: Path) -> Line:
    rows, rounds = MATERIALIZE[scale]
    versions = {"v": 0}
    asset = dated_asset(rows, versions, DATE_COLUMN)
    managers = _io_managers(workdir / "materialize")
    keys = [data.partition_key(d) for d in range(OTHER_PARTITIONS + 1)]
    for io_manager in managers.values():
        for key in keys:
            _materialize(asset, io_manager, key)
    versions["v"] = 1
    times = interleave(
        [
            Case(name, lambda m=io_manager: _materialize(asset, m, keys[-1]))
            for name, io_manager in managers.items()
        ],
        repeat or rounds,
    )
    equal = _same_rows(workdir / "materialize")
    return line_from_times(
        "7 Delta materialize",
        f"{rows // 1_000}k rows, DATE partitions",
        times,
        "ours",
        "dagster-deltalake",
        target=("<=", 1.0),
        equal=equal,
        notes=[
            f"dg.materialize of one day of {rows:,} rows (a DATE partition column, the case"
            " dagster-deltalake's DeltaLakePyarrowIOManager gets right) in a table of"
            f" {OTHER_PARTITIONS + 1} days; the cases it gets wrong, replayed live: "
            + _their_failures(workdir)
        ],
    )


def _same_rows(root: Path) -> bool:
    """Both IO managers' tables hold the same rows (each layout's own columns left out)."""
    tables = [
        DeltaTable(str(root / side / "main" / data.TABLE)).to_pyarrow_table()
        for side in ("ours", "theirs")
    ]
    with duckdb.connect() as conn:
        for i, table in enumerate(tables):
            conn.register(f"t{i}", table.drop_columns([c for c in table.column_names if c == DAY]))
        columns = ", ".join(sorted(tables[1].column_names))
        diff = conn.sql(
            f"SELECT count(*) FROM ((SELECT {columns} FROM t0 EXCEPT ALL SELECT {columns} FROM t1)"
            f" UNION ALL (SELECT {columns} FROM t1 EXCEPT ALL SELECT {columns} FROM t0))"
        ).fetchall()[0][0]
    return diff == 0 and tables[0].num_rows == tables[1].num_rows
