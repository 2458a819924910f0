"""2. End-to-end ``dg.materialize`` of one partition: our IO manager vs DuckDBPandasIOManager."""

from pathlib import Path

import dagster as dg
import duckdb
from dagster_duckdb_pandas import DuckDBPandasIOManager

import idem_assets as ia
from benchmarks import data
from benchmarks.harness import Case, Line, Scale, interleave, line_from_times

SIZES: dict[Scale, list[tuple[int, int]]] = {
    "tiny": [(1_000, 2), (10_000, 2)],
    "full": [(100_000, 11), (1_000_000, 9)],
}
OTHER_PARTITIONS = 4
TARGET_DAY = OTHER_PARTITIONS
#: Quiet console: the default DEBUG logger would time terminal output, the same for both sides.
QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}


def _asset(batch: object) -> dg.AssetsDefinition:
    @dg.asset(
        name=data.TABLE,
        partitions_def=data.DAILY,
        metadata={"partition_expr": data.PARTITION_COLUMN, "primary_key": [data.KEY]},
    )
    def trips() -> object:
        """Trips of one day (built before the run, so only the write is measured)."""
        return batch

    return trips


def _materialize(
    asset: dg.AssetsDefinition, io_manager: dg.ConfigurableIOManager, instance: dg.DagsterInstance
) -> None:
    result = dg.materialize(
        [asset],
        partition_key=data.partition_key(TARGET_DAY),
        resources={"io_manager": io_manager},
        instance=instance,
        run_config=QUIET,
    )
    if not result.success:
        raise AssertionError("materialization failed")


def _fingerprint(path: Path) -> str | None:
    conn = duckdb.connect(str(path))
    try:
        window = data.window([TARGET_DAY])
        return ia.table_fingerprint(conn, "main", data.TABLE, data.PARTITION_COLUMN, window)
    finally:
        conn.close()


def run(scale: Scale, repeat: int | None, workdir: Path) -> list[Line]:
    """Materialize the same partition through each IO manager, interleaved."""
    instance = dg.DagsterInstance.ephemeral()
    largest = max(rows for rows, _ in SIZES[scale])
    return [
        _compare(rows, repeat or rounds, workdir, instance, rows == largest)
        for rows, rounds in SIZES[scale]
    ]


def _compare(
    rows: int, rounds: int, workdir: Path, instance: dg.DagsterInstance, largest: bool
) -> Line:
    batch = data.trips(TARGET_DAY, rows)
    frame = batch.to_pandas()
    ours_db = workdir / f"materialize_ours_{rows}.duckdb"
    theirs_db = workdir / f"materialize_pandas_{rows}.duckdb"
    setup = [data.trips(d, rows, seed=1) for d in range(OTHER_PARTITIONS + 1)]
    for path in (ours_db, theirs_db):
        conn = duckdb.connect(str(path))
        data.load(conn, setup)
        conn.close()
    ours = (_asset(batch), ia.DuckDBOverwriteIOManager(database=str(ours_db)))
    theirs = (_asset(frame), DuckDBPandasIOManager(database=str(theirs_db), schema="main"))
    times = interleave(
        [
            Case("DuckDBPandasIOManager", lambda: _materialize(*theirs, instance)),
            Case("DuckDBOverwriteIOManager", lambda: _materialize(*ours, instance)),
        ],
        rounds,
    )
    label = f"{rows // 1_000_000}M rows" if rows >= 1_000_000 else f"{rows // 1_000}k rows"
    return line_from_times(
        "2 materialize",
        label,
        times,
        "DuckDBPandasIOManager",
        "DuckDBOverwriteIOManager",
        target=(">=", 1.3) if largest else (">=", 1.0),
        equal=_fingerprint(ours_db) == _fingerprint(theirs_db),
        notes=[
            f"whole dg.materialize of one partition of a table holding {OTHER_PARTITIONS} other"
            " partitions; ours gets a pyarrow Table, the pandas IO manager a DataFrame (converted"
            " before the run). Target: ours faster (A/B > 1) at both sizes, >= 1.3x at the larger"
        ],
    )
