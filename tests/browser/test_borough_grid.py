"""daily_borough_revenue's partitions page: a grid of days by boroughs, its written cells green.

Two days of trips are loaded, then an asset backfill writes four (day, borough) partitions: every
borough of the first day and one of the second. The UI shows the two dimensions, the boroughs and
exactly those four cells as materialized.
"""

import re
from datetime import date, timedelta
from pathlib import Path

import pytest
from e2e.dagster_services import DagsterServices
from playwright.sync_api import Locator, Page, expect

from idem_assets import landing
from idem_assets.defs.zones import BOROUGHS

from .conftest import Screenshots, metadata_value

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ASSET = "daily_borough_revenue"
FIRST_DAY = date(2026, 1, 1)
DAYS = [(FIRST_DAY + timedelta(days=i)).isoformat() for i in range(2)]
ROWS_PER_DAY = 100
#: Every borough of the first day, and Queens of the second.
WRITTEN = [f"{b}|{DAYS[0]}" for b in BOROUGHS] + [f"Queens|{DAYS[1]}"]
RUN_TIMEOUT_S = 240.0


@pytest.fixture
def landing_dir(tmp_path: Path) -> Path:
    """Two days of 100 trips."""
    root = tmp_path / "landing"
    landing.generate(root, FIRST_DAY, date.fromisoformat(DAYS[-1]), rows=ROWS_PER_DAY)
    return root


def backfill(services: DagsterServices, assets: list[str], keys: list[str]) -> list[str]:
    """An asset backfill, launched as the UI launches one; the partitions of its runs."""
    backfill_id = services.client.launch_partition_backfill(
        assets, keys, location=services.location_name
    )
    result = services.client.wait_for_backfill(backfill_id, timeout_s=RUN_TIMEOUT_S)
    runs = services.client.runs_for_backfill(backfill_id)
    assert result["status"] == "COMPLETED_SUCCESS", (result, runs)
    assert {run.status for run in runs} == {"SUCCESS"}, runs
    return sorted(str(run.partition) for run in runs)


def test_the_partitions_page_shows_days_by_boroughs_with_the_written_cells_materialized(
    services: DagsterServices, page: Page, screenshots: Screenshots
) -> None:
    shots = screenshots
    backfill(services, ["raw_trips", "trips"], DAYS)
    # Dagster runs each day's boroughs as one range: the day's three, then Queens alone.
    assert backfill(services, [ASSET], WRITTEN) == [
        f"{BOROUGHS[0]}|{DAYS[0]}...{BOROUGHS[-1]}|{DAYS[0]}",
        f"Queens|{DAYS[1]}",
    ]

    with shots.step(page, "a grid of days by boroughs, four cells materialized"):
        page.goto(f"{services.url}/assets/{ASSET}?view=partitions")
        # Each dimension is a list of its own, filtered by name; the date list fills in from
        # the borough picked in the first.
        for dimension in ("borough", "date"):
            shots.expect_visible(
                page, page.get_by_placeholder(f"Filter by {dimension}…"), f"{dimension} list"
            )
        for borough in BOROUGHS:
            shots.expect_visible(
                page, page.get_by_text(borough, exact=True).first, f"borough {borough}"
            )
        selection = page.locator("input[value^='[2026-01-01']").first
        selection.fill(f"[{DAYS[0]}...{DAYS[-1]}]")
        selection.press("Enter")
        cells = len(DAYS) * len(BOROUGHS)
        expect(page.get_by_text(f"{cells} Partitions Selected")).to_be_visible()
        expect(status_count(page, "Materialized")).to_have_text(f"Materialized ({len(WRITTEN)})")
        expect(status_count(page, "Missing")).to_have_text(f"Missing ({cells - len(WRITTEN)})")
    shots.publish(shots.taken[-1], "borough-grid.png")

    with shots.step(page, "a written cell shows its materialization"):
        open_cell(page, "Queens", DAYS[1])
        expect(metadata_value(page, "dagster/row_count")).to_have_text("1")
        expect(metadata_value(page, "window")).to_have_text(
            "[2026-01-02T00:00:00+00:00, 2026-01-03T00:00:00+00:00) borough=Queens"
        )

    with shots.step(page, "a cell not written shows none"):
        open_cell(page, "Brooklyn", DAYS[1])
        shots.expect_visible(page, page.get_by_text("No metadata entries"), "no materialization")


def status_count(page: Page, status: str) -> Locator:
    """The count next to a status filter of the partitions view, e.g. 'Missing (2)'."""
    return page.get_by_text(re.compile(rf"^{status}\s*\(\d+\)$"))


def open_cell(page: Page, borough: str, day: str) -> None:
    """Pick a borough in the first list, then a day in the second: that cell's details."""
    page.get_by_text(borough, exact=True).first.click()
    page.get_by_text(day, exact=True).first.click()
    expect(page.get_by_text("Latest materialization")).to_be_visible()
