"""The demo behind ``make demo``: run, rerun, refuse a bad batch, apply a correction.

Every step goes through the ``dg`` CLI against the real code location, the way a data engineer
or CI would run it, and the row counts are read back from the DuckDB file after each step.
"""

import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Sequence
from datetime import date
from pathlib import Path

import dagster as dg

#: The Dagster APIs in beta or preview the code location uses on purpose (docs/preview-apis.md):
#: each warns when the location loads, and the demo's reader can do nothing about it.
CHOSEN_PREVIEW_APIS: tuple[tuple[type[Warning], str], ...] = (
    (dg.BetaWarning, r"Class `MultiToSingleDimensionPartitionMapping` is currently in beta"),
    (dg.BetaWarning, r"Parameter `backfill_policy` of function `asset` is currently in beta"),
    (dg.PreviewWarning, r"Specifying a partitions_def on an AssetCheckSpec is currently in"),
)
for _category, _message in CHOSEN_PREVIEW_APIS:
    warnings.filterwarnings("ignore", message=_message, category=_category)

# The location's modules are imported after the filters, as importing them defines the assets.
import idem_assets as ia  # noqa: E402
from idem_assets import landing  # noqa: E402
from idem_assets.defs.daily_borough_revenue import daily_borough_revenue  # noqa: E402
from idem_assets.defs.daily_zone_revenue import daily_zone_revenue  # noqa: E402
from idem_assets.defs.raw_trips import raw_trips  # noqa: E402
from idem_assets.defs.reconciliation import rows_per_day  # noqa: E402
from idem_assets.defs.revenue_running_total import revenue_running_total  # noqa: E402
from idem_assets.defs.trips import trips  # noqa: E402
from idem_assets.defs.warehouse import REPO_ROOT, warehouse_path  # noqa: E402
from idem_assets.worked_example import render_table, run_worked_example  # noqa: E402

DAYS = ["2026-01-01", "2026-01-02", "2026-01-03"]
IN_PROCESS = '{"execution": {"config": {"in_process": {}}}}'
#: The warehouse's tables in the order the demo prints them, each its asset's own.
ASSETS = (raw_trips, trips, daily_zone_revenue, revenue_running_total)
TABLES = [a.key.to_user_string() for a in ASSETS]
#: The warehouse's table the demo does not print (its partitions are days by boroughs).
BOROUGH_TABLE = daily_borough_revenue.key.to_user_string()
#: Each table's partition column, as its asset's ``partition_expr`` metadata declares it.
PARTITION_COLUMN = {
    a.key.to_user_string(): a.metadata_by_key[a.key]["partition_expr"] for a in ASSETS
}


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def launch(day: str) -> bool:
    """Run the taxi_daily job for one day through the ``dg`` CLI; True when the run succeeded."""
    proc = subprocess.run(
        # In-process: one process per run instead of one per step, as a CI job would run it.
        [
            _bin("dg"),
            "launch",
            "--job",
            "taxi_daily",
            "--partition",
            day,
            "--config-json",
            IN_PROCESS,
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.returncode == 0


def rows_per_partition(database: str) -> dict[tuple[str, str], int]:
    """Rows per (table, day) in the warehouse, read without taking the writer lock."""
    if not Path(database).exists():
        return {}
    with ia.duckdb_connection(database, {"access_mode": "READ_ONLY"}) as con:
        return {
            (table, day): n
            for table in TABLES
            for day, n in rows_per_day(con, "main", table, PARTITION_COLUMN[table]).items()
        }


def print_counts(title: str, snapshots: Sequence[tuple[str, dict[tuple[str, str], int]]]) -> None:
    """Print rows per table and day, one column per snapshot."""
    print(f"\n{title}")
    header = f"  {'table':<22}{'day':<12}" + "".join(f"{name:>18}" for name, _ in snapshots)
    print(header)
    print("  " + "-" * (len(header) - 2))
    for table in TABLES:
        for day in DAYS:
            cells = "".join(f"{snap.get((table, day), 0):>18,}" for _, snap in snapshots)
            print(f"  {table:<22}{day:<12}{cells}")


def last_failure(instance: dg.DagsterInstance) -> str:
    """The message of the newest failed step, as the UI would show it."""
    records = instance.get_run_records(limit=1)
    if not records:
        return "(no run recorded)"
    events = instance.all_logs(
        records[0].dagster_run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE
    )
    for event in events:
        data = event.dagster_event.event_specific_data if event.dagster_event else None
        error = getattr(data, "error", None)
        if error is not None:
            cause = error.cause or error
            return cause.message.strip()
    return "(no step failure recorded)"


def main() -> int:
    """Run the demo end to end; exit non-zero if any step does not behave as promised."""
    root = landing.default_landing_dir()
    database = warehouse_path()
    # The worked example's scratch file sits next to the warehouse, so a demo pointed elsewhere
    # (IDEM_DUCKDB_PATH) never touches, or races on, the checkout's .data folder.
    data_dir = Path(database).parent
    print(f"Resetting demo data: {root}, {database} and its assets' history")
    shutil.rmtree(root, ignore_errors=True)
    for suffix in ("", ".wal"):
        Path(database + suffix).unlink(missing_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("DAGSTER_HOME", str(REPO_ROOT / ".dagster_home"))
    Path(os.environ["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)
    # The instance forgets what it recorded for the old warehouse, or the UI would show days as
    # materialized (or failed) that the new warehouse does not hold.
    with dg.DagsterInstance.get() as instance:
        instance.wipe_assets([dg.AssetKey(table) for table in (*TABLES, BOROUGH_TABLE)])

    print("\n1. The reference's worked example: the same three days written twice")
    print(render_table(run_worked_example(str(data_dir / "worked_example.duckdb"))))

    print("\n2. Three landing files of 1,000 trips each, run through `dg launch`, then rerun")
    landing.generate(root, date(2026, 1, 1), date(2026, 1, 3), rows=1000)
    ok = all(launch(day) for day in DAYS)
    first = rows_per_partition(database)
    ok = all(launch(day) for day in DAYS) and ok
    second = rows_per_partition(database)
    print_counts("Rows per partition", [("run 1", first), ("rerun", second)])
    if not ok or first != second:
        print("FAILED: a rerun changed the row counts", file=sys.stderr)
        return 1
    print("  -> the rerun replaced each day; nothing doubled.")

    print("\n3. A bad batch: 2026-01-02's file now holds a trip dated 2026-01-01")
    landing.add_stray_row(root, date(2026, 1, 2), date(2026, 1, 1))
    refused = not launch("2026-01-02")
    after_bad = rows_per_partition(database)
    with dg.DagsterInstance.get() as instance:
        message = last_failure(instance)
    print("  The run was refused:\n    " + "\n    ".join(message.splitlines()[:6]))
    print_counts("Rows per partition", [("before", second), ("after refusal", after_bad)])
    if not refused or after_bad != second:
        print("FAILED: the bad batch was not refused cleanly", file=sys.stderr)
        return 1
    print("  -> readers keep the last good data.")

    print("\n4. A corrected file for 2026-01-03: 10 fares changed, 5 trips withdrawn")
    landing.correct(root, date(2026, 1, 3), changed=10, removed=5)
    corrected = launch("2026-01-03")
    after_fix = rows_per_partition(database)
    print_counts("Rows per partition", [("before", after_bad), ("after correction", after_fix)])
    expected = dict(after_bad)
    expected[("raw_trips", "2026-01-03")] -= 5
    expected[("trips", "2026-01-03")] -= 5
    if not corrected or {k: v for k, v in after_fix.items() if k[0] in ("raw_trips", "trips")} != {
        k: v for k, v in expected.items() if k[0] in ("raw_trips", "trips")
    }:
        print("FAILED: the correction did not replace exactly its day", file=sys.stderr)
        return 1
    print("  -> the merge removed the withdrawn trips of that day only.")

    print("\n5. The source re-sends 2026-01-02 without the stray trip; the same run now loads it")
    landing.generate(root, date(2026, 1, 2), date(2026, 1, 2), rows=1000)
    resent = launch("2026-01-02")
    after_resend = rows_per_partition(database)
    print_counts("Rows per partition", [("before", after_fix), ("after re-send", after_resend)])
    day_two = {k: v for k, v in second.items() if k[1] == "2026-01-02"}
    if not resent or {k: v for k, v in after_resend.items() if k[1] == "2026-01-02"} != day_two:
        print("FAILED: the re-sent file did not load as the original did", file=sys.stderr)
        return 1
    print("  -> every landing file is clean again, and the warehouse holds each one.")
    print(
        "\nOpen the same data in the UI with `make dev` (http://127.0.0.1:3000): it adds the"
        " missing days of January, so a backfill of the whole month succeeds."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
