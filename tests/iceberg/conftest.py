"""The Iceberg tests' catalogs: a SQLite file per test, PostgreSQL where a test says so."""

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import idem_assets as ia
from idem_assets.lib.backends.iceberg.backend import IcebergBackend
from idem_assets.lib.backends.iceberg.catalog import IcebergLocation
from idem_assets.lib.backends.postgres.backend import PostgresLocation
from tests.conformance.conftest import PASSWORD_ENV
from tests.conformance.test_replace_contract import ALL_DAYS, EVENTS, events
from tests.defs.conftest import make_pipeline  # noqa: F401  (the taxi location's pipelines)
from tests.helpers import NOW, settings, window

#: ``IDEM_FULL=1`` runs the kill trials at their full count (``make test-full``).
FULL = os.environ.get("IDEM_FULL", "") not in ("", "0")


@pytest.fixture
def location(tmp_path: Path) -> IcebergLocation:
    """A SQLite catalog and a warehouse folder of the test's own."""
    return IcebergLocation.local(tmp_path / "iceberg")


@pytest.fixture
def postgres_catalog(
    tmp_path: Path, postgres_location: PostgresLocation, monkeypatch: pytest.MonkeyPatch
) -> IcebergLocation:
    """A SQL catalog in a fresh PostgreSQL database, its password in the environment."""
    monkeypatch.setenv(PASSWORD_ENV, str(postgres_location.password))
    pg = postgres_location
    uri = f"postgresql+psycopg2://{pg.user}@{pg.host}:{pg.port}/{pg.database}"
    return IcebergLocation(uri, f"file://{tmp_path / 'warehouse'}", password_env=PASSWORD_ENV)


def publish(
    location: IcebergLocation, batch: pa.Table, mode: str, *days: str, **metadata: Any
) -> ia.PublishResult:
    """One publish of ``days`` through a backend of its own."""
    with IcebergBackend(location) as backend:
        return ia.publish(
            backend,
            batch,
            settings(mode, {**EVENTS, **metadata}, table="events"),
            window(*days),
            now=NOW,
        )


def fill(location: IcebergLocation, mode: str = "overwrite") -> None:
    """The three days of version 0, one publish each."""
    for day in ALL_DAYS:
        publish(location, events(day), mode, day)


def stored(
    location: IcebergLocation, table: str = "events", snapshot_id: int | None = None
) -> list[tuple]:
    """Every row of ``main.<table>`` (at ``snapshot_id``), sorted."""
    with IcebergBackend(location) as backend:
        found = backend.catalog.load_table(("main", table)).scan(snapshot_id=snapshot_id).to_arrow()
    return sorted(zip(*found.to_pydict().values(), strict=True))


def expected(*batches: pa.Table) -> list[tuple]:
    """The rows of ``batches`` as :func:`stored` returns them."""
    both = pa.concat_tables(batches)
    return sorted(zip(*both.to_pydict().values(), strict=True))


def files_on_disk(location: IcebergLocation, table: str = "events") -> set[str]:
    """Every file under the table's folder."""
    assert location.warehouse is not None
    root = Path(location.warehouse.removeprefix("file://")) / "main" / table
    return {str(p) for p in root.rglob("*") if p.is_file()}
