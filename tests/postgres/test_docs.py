"""The Postgres configuration the README prints, run as printed against a real server."""

from typing import Any

import dagster as dg
import pytest

from idem_assets.lib.backends.postgres import PostgresBackend, PostgresLocation
from tests.helpers import readme_python


def test_the_readme_postgres_example_runs_as_printed(
    postgres_location: PostgresLocation, monkeypatch: pytest.MonkeyPatch
) -> None:
    loc = postgres_location
    monkeypatch.setenv(
        "WAREHOUSE_URL", f"postgresql://{loc.user}@{loc.host}:{loc.port}/{loc.database}"
    )
    monkeypatch.setenv("PGPASSWORD", str(loc.password))
    namespace: dict[str, Any] = {}
    exec(compile(readme_python("### On PostgreSQL"), "README.md", "exec"), namespace)
    defs: dg.Definitions = namespace["defs"]
    job = defs.resolve_implicit_global_asset_job_def()
    for _run in range(2):
        assert job.execute_in_process(partition_key="2026-01-02").success
    with PostgresBackend.connect(loc) as backend:
        backend.cur.execute("SELECT pickup_at::text, fare FROM main.fares")
        assert backend.cur.fetchall() == [("2026-01-02 00:00:00", 12.5)]
