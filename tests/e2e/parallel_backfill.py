"""A one-run-per-day backfill of taxi_daily on deploy/'s Postgres instance, on either warehouse.

Shared by tests/e2e/test_parallel_backfill.py and benchmarks/parallel_backfill.py: the stock
daemon and webserver and a gRPC code server run deploy/dagster.yaml and deploy/workspace.yaml
unchanged, with the warehouse chosen by IDEM_WAREHOUSE; the backfill is launched with
`dagster job backfill`, as a user does, and each day's rows are read back through the backend.
"""

import os
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import dagster as dg
from postgres_server import PostgresServer

import idem_assets as ia
from idem_assets import landing
from idem_assets.defs.daily_zone_revenue import daily_zone_revenue
from idem_assets.defs.partitions import DAILY
from idem_assets.defs.raw_trips import raw_trips
from idem_assets.defs.revenue_running_total import revenue_running_total
from idem_assets.defs.stale_totals import revenue_per_day, stale_totals, stored_totals
from idem_assets.defs.trips import trips
from idem_assets.lib.backends.duckdb.backend import DuckDBBackend
from idem_assets.lib.backends.postgres.backend import PostgresBackend, PostgresLocation
from idem_assets.lib.write.seam import Backend, TableRef

from .dagster_services import REPO_ROOT, DagsterServices, RunRecord
from .test_backfills import run_events, summary

DEPLOY = REPO_ROOT / "deploy"
ASSETS = (raw_trips, trips, daily_zone_revenue, revenue_running_total)
LAUNCHED = "Launched backfill job `"


@dataclass(frozen=True)
class Stack:
    """The services and where the chosen warehouse lives."""

    services: DagsterServices
    engine: str
    server: PostgresServer
    warehouse_db: str
    duckdb_path: Path

    @property
    def pool(self) -> str:
        """The warehouse pool's name for this engine."""
        return f"{self.engine}_warehouse"


@dataclass(frozen=True)
class Backfill:
    """The runs of one backfill and what they took."""

    records: list[RunRecord]
    wall_s: float
    #: The most runs in progress at one moment, as the queue counts them (from RUN_STARTING,
    #: when a run takes its slot, to its end).
    overlap: int
    #: The most runs between RUN_START and their end at one moment.
    overlap_started: int
    #: The most steps running at one moment, across runs.
    overlap_steps: int


def postgres_stack(
    server: PostgresServer, work: Path, engine: str, days: Sequence[str], rows: int
) -> Stack:
    """Services (not started) on a fresh Postgres instance and a fresh warehouse of ``engine``."""
    instance_db, warehouse_db = f"dagster_{uuid.uuid4().hex[:12]}", f"wh_{uuid.uuid4().hex[:12]}"
    server.create_database(instance_db)
    server.create_database(warehouse_db)
    landing.generate(
        work / "landing", date.fromisoformat(days[0]), date.fromisoformat(days[-1]), rows=rows
    )
    env = {
        "DAGSTER_PG_HOST": server.host,
        "DAGSTER_PG_PORT": str(server.port),
        "DAGSTER_PG_USER": server.user,
        "DAGSTER_PG_PASSWORD": server.password,
        "DAGSTER_PG_DB": instance_db,
        "IDEM_LANDING_DIR": str(work / "landing"),
        "IDEM_DUCKDB_PATH": str(work / "warehouse.duckdb"),
        "IDEM_WAREHOUSE": engine,
        "IDEM_PG_HOST": server.host,
        "IDEM_PG_PORT": str(server.port),
        "IDEM_PG_USER": server.user,
        "IDEM_PG_DB": warehouse_db,
        "IDEM_PG_PASSWORD": server.password,
    }
    services = DagsterServices(
        dagster_home=work / "dagster_home",
        dagster_yaml=(DEPLOY / "dagster.yaml").read_text(),
        module="idem_assets.definitions",
        working_directory=REPO_ROOT,
        env=env,
        workspace=DEPLOY / "workspace.yaml",
        code_server=True,
    )
    return Stack(services, engine, server, warehouse_db, work / "warehouse.duckdb")


def backfill_one_run_per_day(
    stack: Stack, days: Sequence[str], slots: int, timeout_s: float = 900
) -> Backfill:
    """Give the warehouse pool ``slots``, launch taxi_daily for ``days`` from the CLI, wait."""
    services = stack.services
    services.run_cli(["instance", "concurrency", "set", stack.pool, str(slots)])
    launched_at = time.time()
    completed = services.run_cli(
        [
            "job",
            "backfill",
            "-w",
            str(DEPLOY / "workspace.yaml"),
            "-j",
            "taxi_daily",
            "--from",
            days[0],
            "--to",
            days[-1],
            "--noprompt",
        ]
    )
    backfill_id = completed.stdout.split(LAUNCHED)[1].split("`")[0]
    records = services.wait_for_backfill_runs(backfill_id, len(days), timeout_s=timeout_s)
    measured = summary(
        records, {r.run_id: run_events(services.client, r.run_id) for r in records}, launched_at
    )
    return Backfill(
        records,
        measured["wall_s"],
        measured["overlap_in_progress"],
        measured["overlap_started"],
        measured["overlap_steps"],
    )


@contextmanager
def backend(stack: Stack) -> Iterator[Backend]:
    """The warehouse's backend, as the IO managers open it."""
    if stack.engine == "postgres":
        server = stack.server
        location = PostgresLocation(
            server.host, server.port, server.user, stack.warehouse_db, server.password
        )
        with PostgresBackend.connect(location) as opened:
            yield opened
    else:
        with ia.duckdb_connection(str(stack.duckdb_path)) as conn:
            yield DuckDBBackend(conn)


def settings(asset: dg.AssetsDefinition) -> ia.WriteSettings:
    """Where an asset's table is and how it is partitioned."""
    return ia.resolve_settings(
        asset_key=asset.key,
        metadata=asset.metadata_by_key[asset.key],
        mode="overwrite",
        default_schema=None,
        partitioned=True,
    )


def day_state(stack: Stack, days: Sequence[str]) -> dict[tuple[str, str], tuple[int, int] | None]:
    """Rows and content hash of every (table, day), as the warehouse holds them now."""
    state = {}
    with backend(stack) as opened:
        for asset in ASSETS:
            s = settings(asset)
            for day in days:
                window = ia.window_from_keys(DAILY, [day], s.asset)
                state[(s.table, day)] = opened.fingerprint(
                    TableRef(s.schema, s.table), s.partition_columns, window
                )
    return state


def stale_running_totals(stack: Stack) -> tuple[list[str], list[str]]:
    """The days that hold a total, and those whose total is not the revenue summed up to them."""
    with backend(stack) as opened:
        stored = stored_totals(
            opened.load(settings(revenue_running_total), None, False, True)  # type: ignore[arg-type]
        )
        revenue = revenue_per_day(
            opened.load(settings(daily_zone_revenue), None, False, True)  # type: ignore[arg-type]
        )
    return sorted(stored), [s.day for s in stale_totals(stored, revenue)]


def drop_warehouse_tables(stack: Stack) -> None:
    """Empty the warehouse, so the next backfill starts from nothing (the instance remembers)."""
    if stack.engine == "postgres":
        stack.server.psql("DROP SCHEMA IF EXISTS main CASCADE", dbname=stack.warehouse_db)
    else:
        for path in (stack.duckdb_path, Path(f"{stack.duckdb_path}.wal")):
            if path.exists():
                os.remove(path)
