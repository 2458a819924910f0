"""The rerun-safety kit, run over every asset of the taxi code location."""

from pathlib import Path
from typing import Any

import dagster as dg
import pytest

import idem_assets as ia
from idem_assets import landing
from idem_assets.defs.daily_revenue_report import ReportExport
from idem_assets.defs.partitions import DAILY
from idem_assets.defs.resources import LandingZone
from idem_assets.testing import PROPERTIES, assert_rerun_safe

from .support import ROWS, build_defs, d

FIRST, LAST = "2026-01-01", "2026-01-03"


def location_assets(defs: dg.Definitions) -> list[Any]:
    """Every daily asset and asset check the code location defines.

    The kit runs every asset over one partitions definition's keys; daily_borough_revenue's
    (day, borough) keys are tested in test_borough_revenue.py.
    """
    daily = [a for a in defs.assets or [] if getattr(a, "partitions_def", None) == DAILY]
    return [*daily, *(defs.asset_checks or [])]


@pytest.mark.slow
def test_every_taxi_asset_is_rerun_safe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "landing"
    landing.generate(root, d(FIRST), d(LAST), rows=ROWS)
    monkeypatch.setenv("IDEM_LANDING_DIR", str(root))
    monkeypatch.setenv("IDEM_DUCKDB_PATH", str(tmp_path / "unused" / "warehouse.duckdb"))
    defs = build_defs()

    def resources(directory: Path) -> dict[str, Any]:
        database = str(directory / "warehouse.duckdb")
        return {
            "overwrite_io_manager": ia.DuckDBOverwriteIOManager(database=database),
            "merge_io_manager": ia.DuckDBMergeIOManager(database=database),
            "landing": LandingZone(root=str(root)),
            "outbox": ia.Outbox(ledger=str(directory / "outbox.sqlite")),
            "report_export": ReportExport(directory=str(directory / "exports")),
        }

    report = assert_rerun_safe(
        location_assets(defs),
        resources=resources,
        partition_range=(FIRST, LAST),
        workdir=tmp_path / "trials",
    )
    assert report.properties == list(PROPERTIES)
    # Every asset imports in a fresh process, every input was reversed.
    assert (report.skipped, report.unseen) == ({}, [])
    assert report.compared == ["raw_trips", "trips", "daily_zone_revenue", "revenue_running_total"]
    # The report stores nothing; the rerun property counts its exports instead (none repeated).
    assert report.not_stored == ["daily_revenue_report"]
