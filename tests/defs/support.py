"""Shared helpers for the code-location tests: a fresh pipeline per test and result readers."""

import csv
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb

import idem_assets
import idem_assets as ia
import idem_assets.definitions
from idem_assets import landing
from idem_assets.defs.partitions import DAILY
from idem_assets.defs.reconciliation import rows_per_day as read_rows_per_day
from idem_assets.demo import PARTITION_COLUMN, TABLES

#: The project root (where pyproject.toml and dagster.yaml live) and the venv's executables.
REPO = Path(idem_assets.__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
#: Small days keep a run under a second; the generator keeps a normal day fresh at any size.
ROWS = 200
JOB = "taxi_daily"
RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"


def d(key: str) -> date:
    """A partition key as a date."""
    return date.fromisoformat(key)


def days(first: str, last: str) -> list[str]:
    """Every partition key from ``first`` to ``last`` inclusive."""
    n = (d(last) - d(first)).days
    return [(d(first) + timedelta(days=i)).isoformat() for i in range(n + 1)]


def make_recipe(target: str) -> list[str]:
    """The command lines of a Makefile target, as make would run them from the checkout."""
    lines = (REPO / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        if not line.strip().startswith("#"):
            recipe.append(line.strip().replace("$(BIN)/python", sys.executable))
    return recipe


def run_dev_data(landing_dir: Path) -> subprocess.CompletedProcess[str]:
    """Run `make dev-data`'s commands against a landing folder of the test."""
    (command,) = make_recipe("dev-data")
    return subprocess.run(
        command,
        shell=True,
        cwd=REPO,
        env={**os.environ, landing.LANDING_DIR_ENV: str(landing_dir)},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )


def delivered_trips(pipeline: "Pipeline", day: str) -> list[dict[str, str]]:
    """The day's landing CSV as delivered, every value as its exact text."""
    with landing.csv_path(pipeline.root, d(day)).open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def build_defs() -> dg.Definitions:
    """A fresh Definitions, so resources read the environment as it is now."""
    return idem_assets.definitions.defs.load_fn()


@contextmanager
def read(database: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-only connection to the warehouse file."""
    con = duckdb.connect(str(database), read_only=True)
    try:
        yield con
    finally:
        con.close()


@dataclass
class Pipeline:
    """One isolated code location: its landing folder, warehouse file, Definitions and instance."""

    root: Path
    database: Path
    defs: dg.Definitions
    instance: dg.DagsterInstance

    def generate(self, first: str, last: str | None = None, rows: int = ROWS) -> None:
        """Write original landing files for ``first`` to ``last`` (inclusive)."""
        landing.generate(self.root, d(first), d(last or first), rows=rows)

    def run(
        self,
        first: str,
        last: str | None = None,
        assets: Sequence[str] | None = None,
        job_name: str = JOB,
    ) -> dg.ExecuteInProcessResult:
        """Run taxi_daily (or ``assets`` of it, or another job) for a day or a range of days."""
        job = self.defs.resolve_job_def(job_name)
        partition_key: str | None = first
        tags: dict[str, str] = {}
        if last is not None and last != first:
            partition_key, tags = None, {RANGE_START: first, RANGE_END: last}
        return job.execute_in_process(
            instance=self.instance,
            partition_key=partition_key,
            tags=tags,
            asset_selection=[dg.AssetKey(a) for a in assets] if assets else None,
            raise_on_error=False,
        )

    def run_ok(
        self,
        first: str,
        last: str | None = None,
        assets: Sequence[str] | None = None,
        job_name: str = JOB,
    ) -> dg.ExecuteInProcessResult:
        """Like :meth:`run`, but fail the test with the run's error when it does not succeed."""
        result = self.run(first, last, assets, job_name)
        assert result.success, failure_text(result)
        return result

    def materialize(
        self, asset: str, first: str, last: str | None = None
    ) -> dg.ExecuteInProcessResult:
        """``dg.materialize`` one asset of the location for a partition key or a key range."""
        partition_key: str | None = first
        tags: dict[str, str] = {}
        if last is not None and last != first:
            partition_key, tags = None, {RANGE_START: first, RANGE_END: last}
        return dg.materialize(
            [a for a in self.defs.assets or [] if isinstance(a, dg.AssetsDefinition)],
            selection=[dg.AssetKey(asset)],
            partition_key=partition_key,
            tags=tags,
            resources=self.defs.resources,
            instance=self.instance,
            raise_on_error=False,
        )

    def run_request(self, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
        """Execute a schedule's or sensor's request on taxi_daily, as the daemon would launch it."""
        return self.defs.resolve_job_def(JOB).execute_in_process(
            instance=self.instance,
            partition_key=request.partition_key,
            tags=dict(request.tags),
            asset_selection=list(request.asset_selection) if request.asset_selection else None,
            raise_on_error=False,
        )

    def logs(self, result: dg.ExecuteInProcessResult) -> list[str]:
        """The run's log messages, including the assets' own ``context.log`` lines."""
        return [entry.user_message for entry in self.instance.all_logs(result.run_id)]

    def fingerprints(self) -> dict[str, str | None]:
        """The fingerprint of every table (``None`` for a table not created yet)."""
        return fingerprints(self.database)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of a read-only query on the warehouse."""
        with read(self.database) as con:
            return con.execute(sql, list(params)).fetchall()

    def rows_per_day(self, table: str) -> dict[str, int]:
        """Rows per partition day of ``table``."""
        return rows_per_day(self.database, table)


#: ``make_pipeline(name, root=None)``: a pipeline under ``tmp_path/name`` (see conftest).
MakePipeline = Callable[..., Pipeline]


def fingerprints(database: Path) -> dict[str, str | None]:
    """The fingerprint of every table in ``database``."""
    if not database.exists():
        return dict.fromkeys(TABLES)
    with read(database) as con:
        return {t: ia.table_fingerprint(con, "main", t) for t in TABLES}


def day_fingerprints(database: Path, keys: Sequence[str]) -> dict[tuple[str, str], str | None]:
    """The fingerprint of each day of each table, by (table, day)."""
    with read(database) as con:
        return {
            (table, key): ia.table_fingerprint(
                con,
                "main",
                table,
                PARTITION_COLUMN[table],
                ia.window_from_keys(DAILY, [key], table),
            )
            for table in TABLES
            for key in keys
        }


def rows_per_day(database: Path, table: str) -> dict[str, int]:
    """Rows per partition day of ``table`` in ``database``."""
    with read(database) as con:
        return read_rows_per_day(con, "main", table, PARTITION_COLUMN[table])


def check_evaluations(result: dg.ExecuteInProcessResult) -> dict[tuple[str, str], Any]:
    """Every asset check evaluation of the run, by (asset, check name)."""
    evaluations = {}
    for event in result.all_events:
        if event.event_type_value == "ASSET_CHECK_EVALUATION":
            ev = event.event_specific_data
            evaluations[(ev.asset_key.to_user_string(), ev.check_name)] = ev
    return evaluations


def failed_checks(result: dg.ExecuteInProcessResult) -> set[tuple[str, str]]:
    """(asset, check) of every evaluation that did not pass."""
    return {k for k, ev in check_evaluations(result).items() if not ev.passed}


def materialized(result: dg.ExecuteInProcessResult) -> dict[str, list[str | None]]:
    """Partitions materialized in the run, per asset."""
    out: dict[str, list[str | None]] = {}
    for event in result.get_asset_materialization_events():
        m = event.materialization
        out.setdefault(m.asset_key.to_user_string(), []).append(m.partition)
    return out


def metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict[str, Any]:
    """Plain metadata values of the (first) materialization of ``asset`` in the run."""
    for event in result.get_asset_materialization_events():
        m = event.materialization
        if m.asset_key == dg.AssetKey(asset):
            return {k: v.value for k, v in m.metadata.items()}
    raise AssertionError(f"{asset} was not materialized; got {sorted(materialized(result))}")


def failure_text(result: dg.ExecuteInProcessResult) -> str:
    """Every step failure's error chain, as one string."""
    parts = []
    for event in result.all_events:
        if event.event_type_value in ("STEP_FAILURE", "RUN_FAILURE"):
            error = getattr(event.event_specific_data, "error", None)
            while error is not None:
                parts.append(f"{error.cls_name}: {error.message}")
                error = error.cause
    return "\n".join(parts)
