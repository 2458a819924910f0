"""The bad-input catalogue (docs/bad-inputs.md): each input is refused, or accepted as noted, and
the whole database (every schema, table, column type and row) is exactly as it was.

The warehouse is built the way the code location builds it: landing files read by the real
``raw_trips`` asset and merged by the real ``trips`` asset, plus a few tables that give the
catalogue other shapes (an audited ``readings`` asset, a TIMESTAMPTZ table, a second schema and a
table of unusual strings). Each case runs on a fresh copy of that file.
"""

import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import dagster as dg
import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import idem_assets as ia
from idem_assets import landing
from idem_assets.defs.raw_trips import raw_trips
from idem_assets.defs.resources import LandingZone
from idem_assets.defs.trips import trips
from idem_assets.lib.dagster_layer.frames import to_arrow
from tests.helpers import range_tags

from .support import DAILY, NOW, database_fingerprint

DAYS = ("2026-01-01", "2026-01-02", "2026-01-03")
DAY = "2026-01-02"
RAW: dict[str, Any] = {"partition_expr": "pickup_at"}
TRIPS: dict[str, Any] = {"partition_expr": "pickup_at", "primary_key": ["trip_id"]}
READINGS_CHECKS = [ia.not_null("value"), ia.between("value", 0, 100)]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "bad-inputs.md"
OLD_STAGED_NAME = "idem_staged_batch"
NOTES: dict[str, Any] = {"partition_expr": "noted_at"}
#: Copies of a day in the checkpointing full-disk case: enough that the checkpoint cannot fit
#: in the file's free blocks whatever else the warehouse holds.
CHECKPOINT_COPIES = 300

#: Strings that must survive a write and a read unchanged (the 1 MB one included).
ODD_STRINGS = [
    "x" * 1_000_000,
    "Zoë, 東京, مرحبا, emoji 🚕🚖, combining é, rtl \u202eabc",
    "nul\x00byte, tab\tnewline\n",
    "",
]
INJECTION_VALUES = [
    "'); DROP TABLE raw_trips; --",
    '" OR 1=1 --',
    "$1; DELETE FROM trips",
    "\\'; ATTACH '/etc/passwd' AS x; --",
]


@dataclass
class Env:
    """One case's warehouse copy and landing folder; ``stack`` undoes mounts and attributes."""

    db: Path
    landing: Path
    tmp: Path
    stack: ExitStack


def connect(
    env: Env, read_only: bool = False, config: dict[str, str] | None = None
) -> duckdb.DuckDBPyConnection:
    return duckdb.connect(str(env.db), read_only=read_only, config=config or {})


def stored(env: Env, table: str, day: str = DAY) -> pa.Table:
    """The rows of one stored partition, as Arrow, in trip order: the input for a mess."""
    start = datetime.fromisoformat(day)
    with connect(env, read_only=True) as conn:
        column = "read_at" if table == "readings" else "pickup_at"
        return conn.sql(
            f"SELECT * FROM main.{table} WHERE {column} >= ? AND {column} < ? ORDER BY ALL",
            params=[start, start + timedelta(days=1)],
        ).to_arrow_table()


def write(
    env: Env,
    batch: pa.Table | pd.DataFrame,
    *,
    table: str = "raw_trips",
    mode: str = "overwrite",
    metadata: dict[str, Any] | None = None,
    keys: tuple[str, ...] = (DAY,),
    read_only: bool = False,
    config: dict[str, str] | None = None,
    asset_key: tuple[str, ...] | None = None,
) -> ia.PublishResult:
    """Publish the way worked_example.py does: resolve_settings, window_from_keys, publish."""
    write_settings = ia.resolve_settings(
        asset_key=dg.AssetKey(list(asset_key or [table])),
        metadata=metadata if metadata is not None else (RAW if mode == "overwrite" else TRIPS),
        mode=mode,  # type: ignore[arg-type]
        default_schema="main",
        partitioned=True,
    )
    window = ia.window_from_keys(DAILY, list(keys), write_settings.asset)
    # The IO managers' own conversion, so a DataFrame's index is treated as in a run.
    arrow = to_arrow(batch, write_settings.asset)
    with connect(env, read_only=read_only, config=config) as conn:
        return ia.publish(conn, arrow, write_settings, window, now=NOW)


HOURLY_NY = dg.HourlyPartitionsDefinition(
    start_date="2026-10-31-00:00", timezone="America/New_York"
)
#: Dagster's key for the second 01:00 of the fall-back day in New York (06:00 UTC).
SECOND_ONE_AM = "2026-11-01-01:00-0500"


def meter(key: str, to_column: Callable[[datetime], Any]) -> pa.Table:
    """Four readings in the hourly New York partition ``key``, dated by ``to_column``."""
    start = HOURLY_NY.time_window_for_partition_key(key).start.astimezone(UTC)
    times = [start + timedelta(minutes=15 * i) for i in range(4)]
    return pa.table(
        {
            "reading_id": [f"{key}/{i}" for i in range(4)],
            "read_at": pa.array([to_column(t) for t in times]),
            "value": pa.array([1.0, 2.0, 3.0, 4.0]),
        }
    )


def write_hourly(env: Env, batch: pa.Table, key: str, table: str) -> ia.PublishResult:
    """Publish ``batch`` into one hourly New York partition of ``table``."""
    write_settings = ia.resolve_settings(
        asset_key=dg.AssetKey([table]),
        metadata={"partition_expr": "read_at"},
        mode="overwrite",
        default_schema="main",
        partitioned=True,
    )
    window = ia.window_from_keys(HOURLY_NY, [key], table)
    with connect(env) as conn:
        return ia.publish(conn, batch, write_settings, window, now=NOW)


def resources(env: Env) -> dict[str, Any]:
    return {
        "landing": LandingZone(root=str(env.landing)),
        "overwrite_io_manager": ia.DuckDBOverwriteIOManager(database=str(env.db)),
        "merge_io_manager": ia.DuckDBMergeIOManager(database=str(env.db)),
    }


def readings_asset(
    values: Callable[[str], pa.Table | pd.DataFrame], checks: list[ia.Check] = READINGS_CHECKS
) -> dg.AssetsDefinition:
    @ia.audited_asset(
        name="readings",
        partitions_def=DAILY,
        io_manager_key="overwrite_io_manager",
        metadata={"partition_expr": "read_at"},
        checks=checks,
    )
    def readings(context: dg.AssetExecutionContext) -> pa.Table | pd.DataFrame:
        """Meter readings, one per hour."""
        return values(context.partition_key)

    return readings


def readings(day: str, value: Any = None) -> pa.Table:
    """24 hourly readings of ``day``; reading 5 holds ``value`` when one is given."""
    start = datetime.fromisoformat(day)
    values = [float(h * 3 % 100) for h in range(24)]
    if value is not None:
        values[5] = value
    return pa.table(
        {
            "reading_id": [f"{day}/{h:02d}" for h in range(24)],
            "read_at": pa.array(
                [start + timedelta(hours=h) for h in range(24)], pa.timestamp("us")
            ),
            "value": pa.array(values, pa.float64()),
        }
    )


def materialize(env: Env, assets: list[Any], partition: str = DAY) -> None:
    dg.materialize(assets, resources=resources(env), partition_key=partition)


def notes(day: str, texts: list[str]) -> pa.Table:
    start = datetime.fromisoformat(day)
    return pa.table(
        {
            "note_id": pa.array(range(len(texts)), pa.int64()),
            "noted_at": pa.array([start + timedelta(hours=i) for i in range(len(texts))]),
            "text": pa.array(texts, pa.string()),
        }
    )


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The warehouse and landing folder every case starts from."""
    root = tmp_path_factory.mktemp("catalogue")
    env = Env(root / "warehouse.duckdb", root / "landing", root, ExitStack())
    landing.generate(env.landing, date(2026, 1, 1), date(2026, 1, 3), rows=200)
    dg.materialize(
        [raw_trips, trips],
        resources=resources(env),
        tags=range_tags(DAYS[0], DAYS[-1]),
    )
    for day in DAYS[:2]:
        materialize(env, [readings_asset(readings)], day)
    # A TIMESTAMPTZ partition column, a second schema, tables of unusual strings and names.
    tz_batch = readings(DAY).set_column(
        1, "read_at", pa.array([datetime(2026, 1, 2, h, tzinfo=UTC) for h in range(24)])
    )
    write(env, tz_batch, table="readings_tz", metadata={"partition_expr": "read_at"})
    archive = stored(env, "raw_trips", "2026-01-01")
    write(env, archive, metadata={**RAW, "schema": "archive"}, keys=("2026-01-01",))
    write(
        env,
        notes("2026-01-01", ODD_STRINGS),
        table="notes",
        metadata={"partition_expr": "noted_at"},
        keys=("2026-01-01",),
    )
    write(env, notes(DAY, INJECTION_VALUES), table="notes", metadata={"partition_expr": "noted_at"})
    write(env, tarifas(), table="tarifas", metadata={"partition_expr": "read_at"})
    write_hourly(env, meter(SECOND_ONE_AM, lambda t: t), SECOND_ONE_AM, "meter_tz")
    write(env, corrections(DAY), table="corrections", metadata={"partition_expr": "read_at"})
    # A table named as the publish once named its staged batch.
    write(env, notes(DAY, ["a note"]), table=OLD_STAGED_NAME, metadata=NOTES)
    return env.db, env.landing


# The inputs ------------------------------------------------------------------------------------


def with_row(batch: pa.Table, **changes: Any) -> pa.Table:
    """``batch`` plus a copy of its first row with ``changes``."""
    row = batch.slice(0, 1).to_pylist()[0]
    row.update(changes)
    return pa.concat_tables([batch, pa.Table.from_pylist([row], batch.schema)])


def replaced(batch: pa.Table, column: str, values: Any) -> pa.Table:
    return batch.set_column(batch.schema.get_field_index(column), column, values)


def null_at(batch: pa.Table, column: str, index: int = 7) -> pa.Table:
    values = batch[column].to_pylist()
    values[index] = None
    return replaced(batch, column, pa.array(values, batch.schema.field(column).type))


def stray_row(env: Env) -> object:
    batch = stored(env, "raw_trips")
    return write(env, with_row(batch, trip_id="T-STRAY", pickup_at=datetime(2026, 1, 1, 23)))


def row_at_window_end(env: Env) -> object:
    batch = stored(env, "raw_trips")
    return write(env, with_row(batch, trip_id="T-MIDNIGHT", pickup_at=datetime(2026, 1, 3)))


def duplicate_keys(env: Env) -> object:
    batch = stored(env, "trips")
    return write(env, with_row(batch, fare=99.0), table="trips", mode="merge")


def null_key(env: Env) -> object:
    return write(env, null_at(stored(env, "trips"), "trip_id"), table="trips", mode="merge")


def null_partition(env: Env) -> object:
    return write(env, null_at(stored(env, "raw_trips"), "pickup_at"))


def empty_batch(env: Env) -> object:
    return write(env, stored(env, "raw_trips").slice(0, 0))


def missing_column(env: Env) -> object:
    return write(env, stored(env, "raw_trips").drop_columns(["tip"]))


def extra_column(env: Env) -> object:
    batch = stored(env, "raw_trips")
    return write(env, batch.append_column("surcharge", pa.array([2.5] * batch.num_rows)))


def integer_to_text(env: Env) -> object:
    batch = stored(env, "raw_trips")
    counts = pa.array([str(v) for v in batch["passenger_count"].to_pylist()])
    return write(env, replaced(batch, "passenger_count", counts))


def reordered_columns(env: Env) -> object:
    batch = stored(env, "raw_trips")
    return write(env, batch.select(list(reversed(batch.column_names))))


def tz_aware_into_naive(env: Env) -> object:
    frame = stored(env, "raw_trips").to_pandas()
    frame["pickup_at"] = frame["pickup_at"].dt.tz_localize("UTC")
    return write(env, frame)


def naive_into_tz_aware(env: Env) -> object:
    return write(env, readings(DAY), table="readings_tz", metadata={"partition_expr": "read_at"})


def partition_column_as_text(env: Env) -> object:
    frame = stored(env, "raw_trips").to_pandas()
    frame["pickup_at"] = frame["pickup_at"].dt.strftime("%Y-%m-%d %H:%M:%S")
    return write(env, frame)


def reading_of(value: float) -> Callable[[Env], object]:
    def run(env: Env) -> object:
        materialize(env, [readings_asset(lambda day: readings(day, value))])
        return None

    return run


def pandas_nan(env: Env) -> object:
    # pandas hands NaN to Arrow as NULL, so `between` passes it and `not_null` must catch it.
    materialize(env, [readings_asset(lambda day: readings(day, float("nan")).to_pandas())])
    return None


def odd_strings(env: Env) -> object:
    return write(
        env,
        notes("2026-01-01", ODD_STRINGS),
        table="notes",
        metadata={"partition_expr": "noted_at"},
        keys=("2026-01-01",),
    )


def odd_strings_round_trip(env: Env) -> None:
    with connect(env, read_only=True) as conn:
        got = conn.execute(
            "SELECT text FROM main.notes WHERE noted_at < '2026-01-02' ORDER BY note_id"
        ).fetchall()
    assert [r[0] for r in got] == ODD_STRINGS


def injection_values(env: Env) -> object:
    return write(
        env, notes(DAY, INJECTION_VALUES), table="notes", metadata={"partition_expr": "noted_at"}
    )


def injection_values_round_trip(env: Env) -> None:
    with connect(env, read_only=True) as conn:
        got = conn.execute(
            "SELECT text FROM main.notes WHERE noted_at >= '2026-01-02' ORDER BY note_id"
        ).fetchall()
    assert [r[0] for r in got] == INJECTION_VALUES


def injected_schema(env: Env) -> object:
    return write(
        env, stored(env, "raw_trips"), metadata={**RAW, "schema": "main; DROP TABLE trips"}
    )


def injected_table(env: Env) -> object:
    return write(env, stored(env, "raw_trips"), table='raw_trips"; DROP TABLE trips; --')


def injected_column(env: Env) -> object:
    batch = stored(env, "raw_trips")
    names = [('fare"; DROP TABLE trips; --' if c == "fare" else c) for c in batch.column_names]
    return write(env, batch.rename_columns(names))


def injected_metadata(env: Env) -> object:
    return write(env, stored(env, "raw_trips"), metadata={"partition_expr": "pickup_at) OR (1=1"})


def injected_partition_key(env: Env) -> object:
    return write(env, stored(env, "raw_trips"), keys=("2026-01-02'; DROP TABLE trips; --",))


def key_before_start(env: Env) -> object:
    batch = stored(env, "raw_trips")
    pickups = pa.array([t - timedelta(days=3) for t in batch["pickup_at"].to_pylist()])
    return write(env, replaced(batch, "pickup_at", pickups), keys=("2025-12-30",))


def key_not_a_day(env: Env) -> object:
    return write(env, stored(env, "raw_trips"), keys=("2026-02-30",))


def key_spelt_differently(env: Env) -> object:
    return write(env, stored(env, "raw_trips"), keys=("2026-1-2",))


def landing_file(env: Env) -> Path:
    return landing.csv_path(env.landing, date.fromisoformat(DAY))


def missing_landing_file(env: Env) -> object:
    landing_file(env).unlink()
    return materialize(env, [raw_trips])


def corrupt_landing_file(env: Env) -> object:
    path = landing_file(env)
    lines = path.read_text().splitlines(keepends=True)
    fields = lines[3].split(",")
    fields[3] = "two"  # passenger_count
    lines[3] = ",".join(fields)
    path.write_text("".join(lines))
    return materialize(env, [raw_trips])


def truncated_landing_file(env: Env) -> object:
    path = landing_file(env)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 - 7])
    return materialize(env, [raw_trips])


def manifest_sha_disagrees(env: Env) -> object:
    path = landing_file(env)
    text = path.read_text()
    fields = text.splitlines()[5].split(",")
    fields[4] = "12.34" if fields[4] != "12.34" else "12.35"  # a valid, different fare
    path.write_text(text.replace(text.splitlines()[5], ",".join(fields), 1))
    return materialize(env, [raw_trips])


def manifest_rows_disagree(env: Env) -> object:
    landing.short_manifest(env.landing, date.fromisoformat(DAY), missing=3)
    return materialize(env, [raw_trips])


def landing_stray_row(env: Env) -> object:
    landing.add_stray_row(env.landing, date.fromisoformat(DAY), date(2026, 1, 1))
    return materialize(env, [raw_trips])


def read_only_connection(env: Env) -> object:
    return write(env, stored(env, "raw_trips"), read_only=True)


def immutable_file(env: Env) -> object:
    if subprocess.run(["chattr", "+i", str(env.db)], capture_output=True).returncode:
        pytest.skip("chattr +i is not available here (needs root on ext2/3/4 or similar)")
    env.stack.callback(subprocess.run, ["chattr", "-i", str(env.db)], check=True)
    return write(env, stored(env, "raw_trips"))


def full_disk(env: Env, checkpoint_threshold: str = "16MB", copies: int = 60) -> object:
    batch = stored(env, "raw_trips")
    mount = env.tmp / "tiny_disk"
    mount.mkdir()
    # Room for the file plus 256 KiB: the guards pass, the commit's WAL write cannot.
    size = env.db.stat().st_size + 256 * 1024
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs to fill ({mounted.stderr.decode().strip()})")
    env.stack.callback(subprocess.run, ["umount", str(mount)], check=True)
    shutil.copy(env.db, mount / env.db.name)
    env.db = mount / env.db.name
    # Copies of the day with fresh trip ids: a valid batch of several megabytes.
    big = pa.concat_tables(
        replaced(batch, "trip_id", pa.array([f"{t}-{i}" for t in batch["trip_id"].to_pylist()]))
        for i in range(copies)
    )
    return write(env, big, config={"checkpoint_threshold": checkpoint_threshold})


def untyped_column(env: Env) -> object:
    batch = readings(DAY).append_column("note", pa.nulls(24))
    return write(env, batch, table="readings_v2", metadata={"partition_expr": "read_at"})


def duplicate_column_names(env: Env) -> object:
    batch = stored(env, "raw_trips")
    doubled = pa.Table.from_arrays(
        [*batch.columns, batch["fare"]], names=[*batch.column_names, "fare"]
    )
    # The first write of a table: DuckDB would create it with a second column named fare_1.
    return write(env, doubled, table="raw_trips_copy")


def random_uuids(env: Env) -> object:
    batch = readings(DAY).append_column(
        "row_uuid", pa.array([str(uuid.uuid4()) for _ in range(24)])
    )
    return write(env, batch, table="readings_v2", metadata={"partition_expr": "read_at"})


def column_with_trailing_newline(env: Env) -> object:
    return write(env, stored(env, "raw_trips").rename_columns({"fare": "fare\n"}))


def tarifas() -> pa.Table:
    return readings(DAY).rename_columns({"value": "tarifa_é"})


def non_ascii_column(env: Env) -> object:
    return write(env, tarifas(), table="tarifas", metadata={"partition_expr": "read_at"})


def non_ascii_column_round_trip(env: Env) -> None:
    with connect(env, read_only=True) as conn:
        got = conn.execute('SELECT "tarifa_é" FROM main.tarifas ORDER BY read_at').fetchall()
    assert [r[0] for r in got] == readings(DAY)["value"].to_pylist()


def checks_on_internal_names(env: Env) -> object:
    names = ("key", "w_start", "w_end", "staged", "windows")

    def values(day: str) -> pa.Table:
        batch = readings(day, 120.0)
        for name in names:
            batch = batch.append_column(name, batch["value"])
        return batch

    checks = [ia.between(name, 0, 100) for name in names]
    return materialize(env, [readings_asset(values, checks)])


def stale_date_column(env: Env) -> object:
    def values(day: str) -> pa.Table:
        batch = readings(day)
        reported = [t.date() - timedelta(days=1) for t in batch["read_at"].to_pylist()]
        return batch.append_column("reported_on", pa.array(reported, pa.date32()))

    checks = [ia.freshness("reported_on", timedelta(hours=6))]
    return materialize(env, [readings_asset(values, checks)])


def fall_back_hour_key(env: Env) -> object:
    return write_hourly(env, meter(SECOND_ONE_AM, lambda t: t), SECOND_ONE_AM, "meter_tz")


def new_york_wall_clock(t: datetime) -> datetime:
    return t.astimezone(ZoneInfo(HOURLY_NY.timezone)).replace(tzinfo=None)


def repeated_hour_on_naive_column(env: Env) -> object:
    batch = meter(SECOND_ONE_AM, new_york_wall_clock)
    return write_hourly(env, batch, SECOND_ONE_AM, "meter_naive")


def hourly_partitions_on_date_column(env: Env) -> object:
    key = "2026-11-01-05:00"
    batch = meter(key, lambda t: new_york_wall_clock(t).date())
    return write_hourly(env, batch, key, "meter_daily")


def missing_upstream_partition(env: Env) -> object:
    @dg.asset(
        partitions_def=DAILY,
        io_manager_key="overwrite_io_manager",
        metadata={"partition_expr": "read_at"},
    )
    def high_readings(readings: pa.Table) -> pa.Table:
        """Readings above 50."""
        return readings.filter(pc.greater(readings["value"], 50))

    # The template materialised readings for 2026-01-01 and 2026-01-02 only.
    dg.materialize(
        [readings_asset(readings), high_readings],
        resources=resources(env),
        partition_key="2026-01-03",
        selection=[high_readings],
    )


def dict_partition_expr(env: Env) -> object:
    metadata = {"partition_expr": {"date": "pickup_at", "zone": "pickup_zone"}}
    return write(env, stored(env, "raw_trips"), metadata=metadata)


def with_uuids(values: Callable[[int], list[str]], rows: int = 24) -> Callable[[Env], object]:
    def run(env: Env) -> object:
        batch = readings(DAY).slice(0, rows)
        batch = batch.append_column("row_uuid", pa.array(values(rows)))
        return write(env, batch, table="readings_v2", metadata={"partition_expr": "read_at"})

    return run


def naive_load_stamp_in_local_time(env: Env) -> object:
    # The machine runs on New York time: a naive now() is five hours behind UTC.
    env.stack.callback(time.tzset)
    env.stack.enter_context(pytest.MonkeyPatch.context()).setenv("TZ", "America/New_York")
    time.tzset()
    local_now = NOW.astimezone(ZoneInfo("America/New_York")).replace(tzinfo=None)
    batch = readings(DAY).append_column("loaded_at", pa.array([local_now] * 24))
    return write(env, batch, table="readings_v2", metadata={"partition_expr": "read_at"})


def corrections(day: str) -> pa.Table:
    """Readings corrected at the source over the quarter hour before NOW."""
    stamps = [NOW.replace(tzinfo=None) - timedelta(minutes=2 + h * 7 % 15) for h in range(24)]
    return readings(day).append_column("updated_at", pa.array(stamps))


def recent_source_updated_at(env: Env) -> object:
    return write(env, corrections(DAY), table="corrections", metadata={"partition_expr": "read_at"})


def key_in_another_partition(env: Env) -> object:
    batch = stored(env, "trips")
    moved = stored(env, "trips", "2026-01-01")["trip_id"][0].as_py()
    ids = batch["trip_id"].to_pylist()
    ids[0] = moved
    return write(env, replaced(batch, "trip_id", pa.array(ids)), table="trips", mode="merge")


def nanosecond_rounds_into_next_day(env: Env) -> object:
    frame = stored(env, "raw_trips").to_pandas()
    last = pd.Timestamp("2026-01-03") - pd.Timedelta(1, "ns")
    late = frame.iloc[[0]].assign(trip_id="T-LAST-NS", pickup_at=last)
    return write(env, pd.concat([frame, late], ignore_index=True))


def range_rerun_missing_a_day(env: Env) -> object:
    batch = pa.concat_tables(stored(env, "raw_trips", day) for day in DAYS if day != DAY)
    return write(env, batch, keys=DAYS)


def second_asset_on_a_table(env: Env) -> object:
    return write(env, stored(env, "raw_trips"), asset_key=("eu", "raw_trips"))


def asset_name_in_another_case(env: Env) -> object:
    return write(env, stored(env, "raw_trips"), asset_key=("Raw_Trips",))


def named_index(env: Env) -> object:
    return write(env, stored(env, "raw_trips").to_pandas().set_index("trip_id"))


def index_named_like_a_column(env: Env) -> object:
    frame = stored(env, "raw_trips").to_pandas()
    return write(env, frame.set_index(pd.Index(range(len(frame)), name="fare")))


def columns_differing_in_case(env: Env) -> object:
    batch = stored(env, "raw_trips")
    return write(env, batch.append_column("FARE", batch["fare"]))


def column_in_another_case(env: Env) -> object:
    batch = stored(env, "raw_trips")
    return write(env, batch.rename_columns([c.title() for c in batch.column_names]))


def asset_named_like_the_staged_batch(env: Env) -> object:
    return write(env, notes(DAY, ["a note"]), table=OLD_STAGED_NAME, metadata=NOTES)


def whole_numbers_into_double(env: Env) -> object:
    batch = readings(DAY)
    whole = replaced(
        batch, "value", pa.array(batch["value"].to_pylist(), pa.float64()).cast(pa.int64())
    )
    return write(env, whole, table="readings", metadata={"partition_expr": "read_at"})


def int32_into_bigint(env: Env) -> object:
    batch = stored(env, "raw_trips")
    return write(env, replaced(batch, "passenger_count", batch["passenger_count"].cast(pa.int32())))


def double_into_bigint(env: Env) -> object:
    batch = stored(env, "raw_trips")
    counts = batch["passenger_count"].cast(pa.float64())
    return write(env, replaced(batch, "passenger_count", counts))


def integer_beyond_double_precision(env: Env) -> object:
    batch = readings(DAY)
    values = [int(v) for v in batch["value"].to_pylist()]
    values[5] = 2**53 + 1
    wide = replaced(batch, "value", pa.array(values, pa.int64()))
    return write(env, wide, table="readings", metadata={"partition_expr": "read_at"})


# The catalogue ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One bad input: what to do, what must be raised (None: accepted), what the message says."""

    act: Callable[[Env], object]
    error: type[BaseException] | None
    problem: tuple[str, ...]
    fix: tuple[str, ...] = ()
    verify: Callable[[Env], None] | None = None


BLOCKED = "blocking check(s) failed on the staged batch"
RERUN = "Fix the input (or the check), then rerun this partition"
IDENT = "Use letters, digits and underscores only"
SCHEMA_FIX = "ALTER TABLE main.raw_trips"
KEY_FIX = "Fix: pass a key of the definition"
DB_FIX = "then rerun the partition"

CASES: dict[str, Case] = {
    "stray-row": Case(
        stray_row,
        ia.StrayRowsError,
        ("1 of 201 rows have 'pickup_at' outside the window",),
        ("context.partition_time_window",),
    ),
    "row-at-window-end": Case(
        row_at_window_end,
        ia.StrayRowsError,
        ("outside the window", "2026-01-03 00:00:00"),
        ("filter the batch to the run's window",),
    ),
    "duplicate-keys": Case(
        duplicate_keys,
        ia.DuplicateKeyError,
        ("1 extra row(s) for keys that appear more than once",),
        ("'dedupe_order_by': ['updated_at']",),
    ),
    "null-key": Case(
        null_key,
        ia.NullValueError,
        ("1 rows have NULL in key column(s) ['trip_id']",),
        ("fill or drop them",),
    ),
    "null-partition-value": Case(
        null_partition,
        ia.NullValueError,
        ("NULL in partition column 'pickup_at'",),
        ("drop or date those rows",),
    ),
    "empty-batch": Case(
        empty_batch,
        ia.EmptyBatchError,
        ("the batch is empty but the window holds 200 rows",),
        ("metadata={'allow_empty': True}",),
    ),
    "missing-column": Case(
        missing_column,
        ia.SchemaMismatchError,
        ("missing columns ['tip']",),
        (SCHEMA_FIX,),
    ),
    "extra-column": Case(
        extra_column,
        ia.SchemaMismatchError,
        ("extra columns ['surcharge']",),
        (SCHEMA_FIX + " ADD COLUMN",),
    ),
    "integer-to-text": Case(
        integer_to_text,
        ia.SchemaMismatchError,
        ("passenger_count: table BIGINT, batch VARCHAR",),
        ("ALTER TABLE main.raw_trips ALTER COLUMN passenger_count TYPE VARCHAR",),
    ),
    "reordered-columns": Case(reordered_columns, None, ()),
    "tz-aware-into-naive": Case(
        tz_aware_into_naive,
        ia.SchemaMismatchError,
        ("pickup_at: table TIMESTAMP, batch TIMESTAMP",),
        ("tz_localize(None)",),
    ),
    "naive-into-tz-aware": Case(
        naive_into_tz_aware,
        ia.SchemaMismatchError,
        ("read_at: table TIMESTAMP WITH TIME ZONE, batch TIMESTAMP",),
        ("both aware",),
    ),
    "partition-column-as-text": Case(
        partition_column_as_text,
        ia.SchemaMismatchError,
        ("'pickup_at' is VARCHAR, not DATE or TIMESTAMP",),
        ("pd.to_datetime(df['pickup_at'])",),
    ),
    "nan-in-range-checked-column": Case(
        reading_of(float("nan")),
        ia.BlockingCheckError,
        (BLOCKED, "value_between_0_and_100: 1 failing row(s)"),
        (RERUN,),
    ),
    "positive-infinity-in-range": Case(
        reading_of(float("inf")),
        ia.BlockingCheckError,
        (BLOCKED, "value_between_0_and_100: 1 failing row(s)"),
        (RERUN,),
    ),
    "negative-infinity-in-range": Case(
        reading_of(float("-inf")),
        ia.BlockingCheckError,
        (BLOCKED, "value_between_0_and_100: 1 failing row(s)"),
        (RERUN,),
    ),
    "pandas-nan-arrives-as-null": Case(
        pandas_nan,
        ia.BlockingCheckError,
        (BLOCKED, "value_not_null: 1 failing row(s)"),
        (RERUN,),
    ),
    "long-strings-and-unicode": Case(odd_strings, None, (), verify=odd_strings_round_trip),
    "injection-in-values": Case(injection_values, None, (), verify=injection_values_round_trip),
    "injection-in-schema": Case(
        injected_schema,
        ia.InvalidIdentifierError,
        ("schema 'main; DROP TABLE trips' is not a plain identifier",),
        (IDENT,),
    ),
    "injection-in-table": Case(
        injected_table,
        ia.InvalidIdentifierError,
        ("table name", "is not a plain identifier"),
        (IDENT,),
    ),
    "injection-in-column": Case(
        injected_column,
        ia.InvalidIdentifierError,
        ("batch column", "is not a plain identifier"),
        (IDENT, "rename the column"),
    ),
    "injection-in-metadata": Case(
        injected_metadata,
        ia.InvalidIdentifierError,
        ("metadata 'partition_expr' 'pickup_at) OR (1=1' is not a plain identifier",),
        (IDENT,),
    ),
    "injection-in-partition-key": Case(
        injected_partition_key,
        ia.ConfigurationError,
        ("is not a partition of its DailyPartitionsDefinition",),
        (KEY_FIX,),
    ),
    "key-before-partitions-start": Case(
        key_before_start,
        ia.ConfigurationError,
        ("partition key '2025-12-30' is not a partition", "from 2026-01-01"),
        (KEY_FIX,),
    ),
    "key-not-a-day": Case(
        key_not_a_day,
        ia.ConfigurationError,
        ("partition key '2026-02-30' is not a partition",),
        (KEY_FIX,),
    ),
    "key-spelt-differently": Case(
        key_spelt_differently,
        ia.ConfigurationError,
        ("partition key '2026-1-2' is not a partition", "keys formatted '%Y-%m-%d'"),
        (KEY_FIX,),
    ),
    "missing-landing-file": Case(
        missing_landing_file,
        landing.MissingLandingFileError,
        ("2026-01-02.csv does not exist",),
        ("Generate it with",),
    ),
    "corrupt-landing-file": Case(
        corrupt_landing_file,
        landing.CorruptLandingFileError,
        ("line 4, column passenger_count: 'two' is not int64",),
        ("Regenerate it with",),
    ),
    "truncated-landing-file": Case(
        truncated_landing_file,
        landing.CorruptLandingFileError,
        ("the file is truncated",),
        ("Regenerate it with",),
    ),
    "manifest-sha-disagrees": Case(
        manifest_sha_disagrees,
        landing.ManifestMismatchError,
        ("does not match its manifest",),
        ("rewrite the manifest or restore the file",),
    ),
    "manifest-rows-disagree": Case(
        manifest_rows_disagree,
        ia.BlockingCheckError,
        (BLOCKED, "row_count: 1 of 1 partition"),
        (RERUN,),
    ),
    "landing-file-with-stray-row": Case(
        landing_stray_row,
        ia.BlockingCheckError,
        (BLOCKED, "in_window: 1 failing row(s)"),
        (RERUN,),
    ),
    "untyped-all-null-column": Case(
        untyped_column,
        ia.SchemaMismatchError,
        ("['note'] hold only NULL and have no type",),
        ("astype('float64')",),
    ),
    "duplicate-column-names": Case(
        duplicate_column_names,
        ia.SchemaMismatchError,
        ("more than one column named ['fare']",),
        ("drop or rename the duplicates",),
    ),
    "random-uuid-column": Case(
        random_uuids,
        ia.RuntimeValueError,
        ("holds random or time-based uuids",),
        ("uuid5 of the row's natural key", "'allow_runtime_columns': ['row_uuid']"),
    ),
    "column-name-with-trailing-newline": Case(
        column_with_trailing_newline,
        ia.InvalidIdentifierError,
        ("batch column 'fare\\n' is not a plain identifier",),
        (IDENT, "Fix: rename the column or table, e.g. to 'fare'"),
    ),
    "non-ascii-column-name": Case(non_ascii_column, None, (), verify=non_ascii_column_round_trip),
    "checks-on-columns-named-like-internals": Case(
        checks_on_internal_names,
        ia.BlockingCheckError,
        (BLOCKED, "key_between_0_and_100: 1 failing row(s)", "windows_between_0_and_100: 1"),
        (RERUN,),
    ),
    "freshness-on-a-date-column": Case(
        stale_date_column,
        ia.BlockingCheckError,
        (BLOCKED, "reported_on_freshness: 1 of 1 partition(s) failed: 2026-01-02"),
        (RERUN,),
    ),
    "fall-back-hour-key": Case(fall_back_hour_key, None, ()),
    "repeated-hour-on-naive-column": Case(
        repeated_hour_on_naive_column,
        ia.ConfigurationError,
        ("2026-11-01T01:00:00-05:00", "cannot tell the two 01:00 hours apart"),
        ("Fix: store the column as TIMESTAMPTZ", "or use UTC partitions"),
    ),
    "hourly-partitions-on-date-column": Case(
        hourly_partitions_on_date_column,
        ia.ConfigurationError,
        ("the partition column is DATE", "finer than the column's resolution"),
        ("Fix: make the partition column a TIMESTAMP", "dg.DailyPartitionsDefinition"),
    ),
    "missing-upstream-partition": Case(
        missing_upstream_partition,
        ia.MissingUpstreamError,
        ("partition(s) ['2026-01-03'] of 'readings' were never materialised",),
        ("Fix: materialise 'readings' for those partition(s) first",),
    ),
    "dict-partition-expr": Case(
        dict_partition_expr,
        ia.ConfigurationError,
        ("the form for a dg.MultiPartitionsDefinition, but the asset has one partition dimension",),
        ("metadata={'partition_expr': 'pickup_at'}", "a dg.MultiPartitionsDefinition with those"),
    ),
    "random-uuid-one-row": Case(
        with_uuids(lambda n: [str(uuid.uuid4())], rows=1),
        ia.RuntimeValueError,
        ("holds random or time-based uuids",),
        ("'allow_runtime_columns': ['row_uuid']",),
    ),
    "random-uuid-with-a-sentinel": Case(
        with_uuids(lambda n: ["n/a"] + [str(uuid.uuid4()) for _ in range(n - 1)]),
        ia.RuntimeValueError,
        ("holds random or time-based uuids",),
        ("'allow_runtime_columns': ['row_uuid']",),
    ),
    "random-uuid-as-hex": Case(
        with_uuids(lambda n: [uuid.uuid4().hex for _ in range(n)]),
        ia.RuntimeValueError,
        ("holds random or time-based uuids",),
        ("'allow_runtime_columns': ['row_uuid']",),
    ),
    "naive-load-stamp-in-local-time": Case(
        naive_load_stamp_in_local_time,
        ia.RuntimeValueError,
        ("every value of 'loaded_at' (2026-11-29 07:00:00", "is the time of this run"),
        ("'allow_runtime_columns': ['loaded_at']",),
    ),
    "recent-source-updated-at": Case(recent_source_updated_at, None, ()),
    "merge-key-in-another-partition": Case(
        key_in_another_partition,
        ia.KeyOutsideWindowError,
        ("1 key(s) of the batch already exist in other partitions",),
        ("rerun the partition that holds them first",),
    ),
    "nanosecond-rounds-into-next-day": Case(
        nanosecond_rounds_into_next_day,
        ia.StrayRowsError,
        (
            "1 of 201 rows have 'pickup_at' inside the window at the batch's precision",
            "2026-01-02 23:59:59.999999999 becomes 2026-01-03 00:00:00",
        ),
        ("df['pickup_at'] = df['pickup_at'].dt.floor('us')",),
    ),
    "range-rerun-missing-a-day": Case(
        range_rerun_missing_a_day,
        ia.EmptyBatchError,
        ("no rows for partition(s) ['2026-01-02'], which hold [200] rows",),
        ("metadata={'allow_empty': True}",),
    ),
    "second-asset-on-a-table": Case(
        second_asset_on_a_table,
        ia.ConfigurationError,
        ("table main.raw_trips belongs to asset 'raw_trips'",),
        ("metadata={'schema': 'eu'}", "hand the table over first: UPDATE"),
    ),
    "asset-name-in-another-case": Case(
        asset_name_in_another_case,
        ia.ConfigurationError,
        ("belongs to asset 'raw_trips'", "differ only in case"),
        ("another asset name",),
    ),
    "named-index": Case(named_index, None, ()),
    "index-named-like-a-column": Case(
        index_named_like_a_column,
        ia.SchemaMismatchError,
        ("index level(s) ['fare'] have the name of a column too",),
        ("df.reset_index(drop=True)",),
    ),
    "columns-differing-in-case": Case(
        columns_differing_in_case,
        ia.SchemaMismatchError,
        ("more than one column named ['FARE', 'fare']", "without regard to case"),
        ("drop or rename the duplicates",),
    ),
    "column-in-another-case": Case(column_in_another_case, None, ()),
    "asset-named-like-the-staged-batch": Case(asset_named_like_the_staged_batch, None, ()),
    "whole-numbers-into-double": Case(whole_numbers_into_double, None, ()),
    "int32-into-bigint": Case(int32_into_bigint, None, ()),
    "double-into-bigint": Case(
        double_into_bigint,
        ia.SchemaMismatchError,
        ("passenger_count: table BIGINT, batch DOUBLE",),
        ("ALTER TABLE main.raw_trips ALTER COLUMN passenger_count TYPE DOUBLE",),
    ),
    "integer-beyond-double-precision": Case(
        integer_beyond_double_precision,
        ia.SchemaMismatchError,
        ("1 value(s) of 'value' (BIGINT) are not exactly representable as DOUBLE",),
        ("df['value'] = df['value'].astype('float64')",),
    ),
    "read-only-connection": Case(
        read_only_connection,
        duckdb.InvalidInputException,
        ("attached in read-only mode",),
        ("open the database read-write", DB_FIX),
    ),
    "immutable-database-file": Case(
        immutable_file,
        duckdb.IOException,
        ("Cannot open file", "Operation not permitted"),
    ),
    "full-disk-during-commit": Case(
        full_disk,
        duckdb.TransactionException,
        ("Failed to commit", "No space left on device"),
        ("free disk space", DB_FIX),
    ),
}


@pytest.fixture
def env(template: tuple[Path, Path], tmp_path: Path) -> Iterator[Env]:
    db, landing_root = template
    shutil.copy(db, tmp_path / db.name)
    shutil.copytree(landing_root, tmp_path / "landing")
    with ExitStack() as stack:
        yield Env(tmp_path / db.name, tmp_path / "landing", tmp_path, stack)


def message(exc: BaseException) -> str:
    return "\n".join([str(exc), *getattr(exc, "__notes__", [])])


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_bad_input_is_refused_names_the_fix_and_leaves_the_database_unchanged(
    env: Env, case: Case
) -> None:
    with connect(env, read_only=True) as conn:
        before = database_fingerprint(conn)

    if case.error is None:
        case.act(env)
        if case.verify is not None:
            case.verify(env)
    else:
        with pytest.raises(case.error) as refused:
            case.act(env)
        text = message(refused.value)
        for fragment in case.problem + case.fix:
            assert fragment in text, f"{fragment!r} not in the message:\n{text}"

    with connect(env, read_only=True) as conn:
        assert database_fingerprint(conn) == before


def test_every_case_is_in_the_catalogue_document() -> None:
    text = DOCS.read_text()
    missing = [name for name in CASES if f"`{name}`" not in text]
    assert missing == [], f"docs/bad-inputs.md has no row for {missing}"


def test_a_full_disk_during_a_checkpointing_commit_is_fatal_but_never_partial(
    env: Env,
) -> None:
    """With a tiny checkpoint threshold the commit itself checkpoints, and that write fails."""
    with connect(env, read_only=True) as conn:
        before = database_fingerprint(conn)
    original = stored(env, "raw_trips")
    with pytest.raises(duckdb.Error) as failed:
        full_disk(env, checkpoint_threshold="1KB", copies=CHECKPOINT_COPIES)
    assert "No space left on device" in message(failed.value)
    assert DB_FIX in message(failed.value)
    with connect(env) as conn:
        after = database_fingerprint(conn)
        day = conn.execute(
            "SELECT count(*) FROM main.raw_trips WHERE pickup_at >= ? AND pickup_at < ?",
            [datetime(2026, 1, 2), datetime(2026, 1, 3)],
        ).fetchall()[0][0]
    # Old or new, never a mix: the old 200 rows, or the whole batch.
    assert after == before or day == CHECKPOINT_COPIES * original.num_rows
