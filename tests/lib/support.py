"""Shared helpers for the idem_assets library tests: a fake source, runs and table readers."""

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import pandas as pd
import pyarrow as pa

import idem_assets as ia
from idem_assets.lib.dagster_layer.frames import to_arrow
from tests.helpers import DAILY, NOW, TRIPS_METADATA, range_tags, settings, window

__all__ = ["DAILY", "NOW", "TRIPS_METADATA", "settings", "window"]

DAYS = ("2026-01-01", "2026-01-02", "2026-01-03")
ROWS_PER_DAY = 1000
OVERWRITE_MD: dict[str, Any] = {"partition_expr": "pickup_at"}
MERGE_MD: dict[str, Any] = {"partition_expr": "pickup_at", "primary_key": ["trip_id"]}


def day_start(day: str) -> datetime:
    """Midnight of ``day`` as a naive datetime (the table stores naive UTC wall-clock time)."""
    return datetime.fromisoformat(day)


def trips(day: str, n: int = ROWS_PER_DAY, *, first_id: int | None = None) -> pd.DataFrame:
    """``n`` deterministic trips dated inside ``day``; trip ids are unique across days."""
    start = day_start(day)
    base = first_id if first_id is not None else int(start.strftime("%Y%m%d")) * 10_000
    return pd.DataFrame(
        {
            "trip_id": [base + i for i in range(n)],
            # 80 s apart: 1,000 trips span 22 hours, the newest 2 h before the day's end.
            "pickup_at": [start + timedelta(seconds=80 * i) for i in range(n)],
            "passenger_count": [1 + i % 6 for i in range(n)],
            "fare": [round(5 + (i % 97) * 0.5, 2) for i in range(n)],
        }
    )


def trips_between(start: datetime, end: datetime, n: int = ROWS_PER_DAY) -> pd.DataFrame:
    """Trips for every day in the half-open window ``[start, end)`` (naive or aware bounds)."""
    days = pd.date_range(start.replace(tzinfo=None), end.replace(tzinfo=None), freq="D")
    frames = [trips(d.strftime("%Y-%m-%d"), n) for d in days if d < end.replace(tzinfo=None)]
    return pd.concat(frames, ignore_index=True)


def trips_asset(
    io_manager: str = "io_manager",
    metadata: Mapping[str, Any] | None = None,
    source: Callable[[dg.AssetExecutionContext], Any] | None = None,
    name: str = "trips",
) -> dg.AssetsDefinition:
    """A daily trips asset whose batch comes from ``source`` (default: the run's window)."""

    def compute(context: dg.AssetExecutionContext) -> Any:
        if source is not None:
            return source(context)
        window = context.partition_time_window
        return trips_between(window.start, window.end)

    return dg.asset(
        name=name,
        partitions_def=DAILY,
        io_manager_key=io_manager,
        metadata=dict(metadata if metadata is not None else TRIPS_METADATA),
    )(compute)


def resources(db: Path) -> dict[str, Any]:
    """Both IO managers on one database file; ``io_manager`` is the overwrite one."""
    return {
        "io_manager": ia.DuckDBOverwriteIOManager(database=str(db)),
        "overwrite_io_manager": ia.DuckDBOverwriteIOManager(database=str(db)),
        "merge_io_manager": ia.DuckDBMergeIOManager(database=str(db)),
    }


def run(
    assets: Sequence[Any],
    db: Path,
    partition: str | None = None,
    *,
    partition_range: tuple[str, str] | None = None,
    raise_on_error: bool = True,
    selection: Sequence[str] | None = None,
    instance: dg.DagsterInstance | None = None,
) -> dg.ExecuteInProcessResult:
    """Materialize ``assets`` for one partition, a partition range (one run), or unpartitioned."""
    tags = {}
    if partition_range is not None:
        tags = range_tags(partition_range[0], partition_range[1])
    return dg.materialize(
        list(assets),
        resources=resources(db),
        partition_key=partition,
        tags=tags,
        raise_on_error=raise_on_error,
        selection=list(selection) if selection is not None else None,
        instance=instance,
    )


def check_statuses(
    instance: dg.DagsterInstance, asset: str, check: str, run_id: str | None = None
) -> dict[str | None, str]:
    """The status the instance records for each partition of one check (of one run, if given).

    The latest record per partition wins; a record still PLANNED after its run ended is what the
    UI shows as a skipped evaluation.
    """
    key = dg.AssetCheckKey(dg.AssetKey(asset), check)
    history = instance.event_log_storage.get_asset_check_execution_history(key, limit=1000)
    statuses: dict[str | None, str] = {}
    for record in reversed(history):  # oldest first, so the latest wins
        if run_id is None or record.run_id == run_id:
            statuses[record.partition] = record.status.value
    return statuses


def output_metadata(result: dg.ExecuteInProcessResult) -> dict[str | None, dict[str, Any]]:
    """Raw materialization metadata of the run, by partition key."""
    return {
        event.materialization.partition: {
            k: v.value for k, v in event.materialization.metadata.items()
        }
        for event in result.get_asset_materialization_events()
    }


def publish(
    conn: duckdb.DuckDBPyConnection,
    batch: Any,
    write_settings: ia.WriteSettings,
    keys: Sequence[str] | None,
    **kwargs: Any,
) -> ia.PublishResult:
    """Publish a DataFrame or Arrow batch into partitions ``keys`` (``None``: unpartitioned)."""
    kwargs.setdefault("now", NOW)
    write_window = window(*keys) if keys else None
    return ia.publish(conn, to_arrow(batch, "test"), write_settings, write_window, **kwargs)


def fingerprint(conn: duckdb.DuckDBPyConnection, table: str = "trips", *keys: str) -> str | None:
    """Fingerprint of the whole table, or of the partitions ``keys`` when given."""
    if keys:
        return ia.table_fingerprint(conn, "main", table, "pickup_at", window(*keys))
    return ia.table_fingerprint(conn, "main", table)


def partition_fingerprints(conn: duckdb.DuckDBPyConnection, table: str = "trips") -> list[Any]:
    """The fingerprint of every test day, plus the whole table's."""
    return [fingerprint(conn, table, day) for day in DAYS] + [fingerprint(conn, table)]


def rows(conn: duckdb.DuckDBPyConnection, table: str = "trips", where: str = "") -> list[tuple]:
    """Every row of ``table``, sorted, so equal tables compare equal whatever the storage order."""
    query = f"SELECT * FROM main.{table}{' WHERE ' + where if where else ''}"
    return sorted(conn.execute(query).fetchall())


def frame_rows(frame: pd.DataFrame) -> list[tuple]:
    """A DataFrame's rows as sorted Python tuples, comparable with :func:`rows`."""
    return sorted(
        tuple(v.to_pydatetime() if isinstance(v, pd.Timestamp) else v for v in row)
        for row in frame.itertuples(index=False, name=None)
    )


def count(conn: duckdb.DuckDBPyConnection, table: str = "trips", day: str | None = None) -> int:
    """Rows in ``table``, or in one day of it."""
    # fetchall(), not fetchone(): DuckDB 2 refuses register() while a result is unfinished.
    if day is None:
        return conn.execute(f"SELECT count(*) FROM main.{table}").fetchall()[0][0]
    start = day_start(day)
    return conn.execute(
        f"SELECT count(*) FROM main.{table} WHERE pickup_at >= ? AND pickup_at < ?",
        [start, start + timedelta(days=1)],
    ).fetchall()[0][0]


def read(db: Path) -> duckdb.DuckDBPyConnection:
    """A connection to the database file (close it before the next Dagster run writes)."""
    return duckdb.connect(str(db))


def fingerprints(db: Path) -> dict[str, Any]:
    """Every table of the file with its column types and (count, hash sum) of its rows."""
    with read(db) as conn:
        tables = conn.execute(
            "SELECT schema_name, table_name FROM duckdb_tables() ORDER BY ALL"
        ).fetchall()
        state: dict[str, Any] = {}
        for schema, table in tables:
            name = f'"{schema}"."{table}"'
            types = conn.execute(f"DESCRIBE {name}").fetchall()
            state[name] = (
                types,
                conn.execute(f"SELECT count(*), sum(hash(COLUMNS(*))) FROM {name}").fetchall(),
            )
        return state


def batch_asset(
    batches: Callable[[str], Any], io_manager: str = "overwrite_io_manager", **kwargs: Any
) -> dg.AssetsDefinition:
    """A daily asset returning ``batches(partition_key)``; ``kwargs`` go to ``dg.asset``."""
    kwargs.setdefault("name", "trips")
    kwargs.setdefault(
        "metadata", OVERWRITE_MD if io_manager == "overwrite_io_manager" else MERGE_MD
    )

    def compute(context: dg.AssetExecutionContext) -> Any:
        return batches(context.partition_key)

    return dg.asset(partitions_def=DAILY, io_manager_key=io_manager, **kwargs)(compute)


def fares(values: list[Any], arrow_type: pa.DataType) -> Callable[[str], pa.Table]:
    """Batches of one trip per value, hourly from the partition's start, with ``fare`` typed.

    Trip ids are the day of the month times 100 plus the trip's place, unique across days.
    """

    def batch(key: str) -> pa.Table:
        start = datetime.fromisoformat(key)
        return pa.table(
            {
                "trip_id": pa.array([start.day * 100 + i for i in range(len(values))], pa.int64()),
                "pickup_at": pa.array(
                    [start + timedelta(hours=i) for i in range(len(values))], pa.timestamp("us")
                ),
                "fare": pa.array(values, arrow_type),
            }
        )

    return batch


def two_days(first: Callable[[str], pa.Table], second: Callable[[str], pa.Table]) -> Any:
    """``first``'s batch for 2026-01-01, ``second``'s for every other day."""
    return lambda key: first(key) if key == "2026-01-01" else second(key)
