"""What docs/postgres.md prints for PostgreSQL, run as printed on a real server."""

import re
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

import idem_assets as ia
from idem_assets.lib.backends.postgres.backend import PostgresBackend, PostgresLocation
from tests.helpers import NOW, doc_python, settings, window
from tests.reliability.support import day_batch

DOC = "docs/postgres.md"


def test_the_postgres_example_runs_as_printed(
    postgres_location: PostgresLocation, monkeypatch: pytest.MonkeyPatch
) -> None:
    loc = postgres_location
    monkeypatch.setenv(
        "WAREHOUSE_URL", f"postgresql://{loc.user}@{loc.host}:{loc.port}/{loc.database}"
    )
    monkeypatch.setenv("PGPASSWORD", str(loc.password))
    namespace: dict[str, Any] = {}
    code = doc_python("### An asset on PostgreSQL", doc=DOC)
    exec(compile(code, DOC, "exec"), namespace)
    defs: dg.Definitions = namespace["defs"]
    job = defs.resolve_implicit_global_asset_job_def()
    for _run in range(2):
        assert job.execute_in_process(partition_key="2026-01-02").success
    with PostgresBackend.connect(loc) as backend:
        backend.cur.execute("SELECT pickup_at::text, fare FROM main.fares")
        assert backend.cur.fetchall() == [("2026-01-02 00:00:00", 12.5)]


def test_the_key_ranges_index_statement_in_the_docs_runs_as_printed(
    postgres_location: PostgresLocation,
) -> None:
    text = (Path(__file__).parents[2] / "docs" / "postgres.md").read_text()
    statement = re.findall(r"`(CREATE INDEX ON main\.trips USING brin[^`]*)`", text)
    assert len(statement) == 1
    with PostgresBackend.connect(postgres_location) as backend:
        # An overwrite creates the table without it, as a table created outside a merge is.
        ia.publish(backend, day_batch("2026-01-01", 5), settings(), window("2026-01-01"), now=NOW)
        backend.cur.execute(statement[0])
        backend.cur.execute("SELECT indexdef FROM pg_indexes WHERE tablename = 'trips'")
        found = {d.split(" USING ")[1] for (d,) in backend.cur.fetchall()}
    assert found == {"brin (trip_id) WITH (autosummarize='on')", "btree (pickup_at)"}
