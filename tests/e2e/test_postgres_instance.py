"""The production instance of deploy/: Postgres storage, the code location served over gRPC.

A throwaway PostgreSQL, a `dagster code-server start`, dagster-daemon and dagster-webserver run
deploy/dagster.yaml and deploy/workspace.yaml unchanged; a three-day backfill of taxi_daily
launched with the command docs/postgres.md prints must succeed, and its runs and events must be
rows in PostgreSQL, not in files under DAGSTER_HOME.
"""

import shlex
import uuid
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path

import dagster as dg
import duckdb
import pytest
from postgres_server import PostgresServer, connect

from idem_assets import landing

from .dagster_services import DagsterServices

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy"
DOCS = REPO_ROOT / "docs" / "postgres.md"
FIRST_DAY = date(2026, 1, 1)
DAYS = [(FIRST_DAY + timedelta(days=i)).isoformat() for i in range(3)]
ROWS_PER_DAY = 50


def documented_commands(marker: str) -> list[str]:
    """The `dagster ...` lines of docs/postgres.md's shell blocks that contain `marker`."""
    lines = DOCS.read_text().splitlines()
    return [line.strip() for line in lines if line.startswith("dagster ") and marker in line]


@pytest.fixture
def services(postgres_server: PostgresServer, tmp_path: Path) -> Iterator[DagsterServices]:
    database = f"dagster_{uuid.uuid4().hex[:12]}"
    postgres_server.create_database(database)
    landing_dir = tmp_path / "landing"
    landing.generate(landing_dir, FIRST_DAY, FIRST_DAY + timedelta(days=2), rows=ROWS_PER_DAY)
    services = DagsterServices(
        dagster_home=tmp_path / "dagster_home",
        dagster_yaml=(DEPLOY / "dagster.yaml").read_text(),
        module="idem_assets.definitions",
        working_directory=REPO_ROOT,
        env={
            "DAGSTER_PG_HOST": postgres_server.host,
            "DAGSTER_PG_PORT": str(postgres_server.port),
            "DAGSTER_PG_USER": postgres_server.user,
            "DAGSTER_PG_PASSWORD": postgres_server.password,
            "DAGSTER_PG_DB": database,
            "IDEM_LANDING_DIR": str(landing_dir),
            "IDEM_DUCKDB_PATH": str(tmp_path / "warehouse.duckdb"),
        },
        workspace=DEPLOY / "workspace.yaml",
        code_server=True,
    )
    services.start()
    try:
        yield services
    finally:
        services.stop()
    assert services.leftover_processes() == []


def test_a_backfill_runs_on_the_postgres_instance_through_the_grpc_code_server(
    services: DagsterServices, postgres_server: PostgresServer, tmp_path: Path
) -> None:
    for command in documented_commands("concurrency set"):
        services.run_cli(shlex.split(command)[1:])
    (backfill,) = documented_commands("job backfill")
    completed = services.run_cli(shlex.split(backfill)[1:])
    backfill_id = completed.stdout.split("Launched backfill job `")[1].split("`")[0]
    finished = services.client.wait_for_backfill(backfill_id, timeout_s=300)
    records = services.client.runs_for_backfill(backfill_id)

    assert {record.partition: record.status for record in records} == dict.fromkeys(DAYS, "SUCCESS")
    database = services.env["DAGSTER_PG_DB"]
    with connect(**postgres_server.connect_kwargs(database)) as conn:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT status, count(*) FROM runs WHERE run_id = ANY(%s) GROUP BY status",
                (finished["run_ids"],),
            )
            assert cur.fetchall() == [("SUCCESS", 3)]
            cur.execute(
                "SELECT count(*) FROM event_logs"
                " WHERE run_id = ANY(%s) AND dagster_event_type = %s",
                # RUN_SUCCESS is stored under its old name, PIPELINE_SUCCESS.
                (finished["run_ids"], dg.DagsterEventType.RUN_SUCCESS.value),
            )
            assert cur.fetchone() == (3,)
            cur.execute(
                'SELECT "limit" FROM concurrency_limits WHERE concurrency_key = %s',
                ("duckdb_warehouse",),
            )
            assert cur.fetchone() == (1,)
    # Nothing fell back to the SQLite storage a DAGSTER_HOME holds by default.
    assert sorted(path.name for path in services.dagster_home.rglob("*.db")) == []
    warehouse = duckdb.connect(str(tmp_path / "warehouse.duckdb"), read_only=True)
    try:
        rows = warehouse.execute(
            "SELECT CAST(pickup_at AS DATE)::VARCHAR, count(*) FROM raw_trips GROUP BY 1 ORDER BY 1"
        ).fetchall()
    finally:
        warehouse.close()
    assert rows == [(day, ROWS_PER_DAY) for day in DAYS]
    # The password reaches the services through the environment only, never their logs.
    logs = [*services.dagster_home.glob("*.log")]
    assert len(logs) == 4
    assert all(postgres_server.password not in log.read_text(errors="replace") for log in logs)
