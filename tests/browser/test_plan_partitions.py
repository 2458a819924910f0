"""A planned backfill in the Dagster UI: each day's plan on the asset's partitions page.

Three days of raw_trips are loaded by a backfill; the middle day's landing file is then
corrected. A backfill of the three days tagged as a plan (ia.PLAN_TAGS) runs under the real
daemon, and the partitions page shows, for each day, what its rerun would change: the corrected
day its counts, an unchanged day no change. Nothing was materialized by the plan.
"""

from datetime import date, timedelta
from pathlib import Path

import duckdb
import pytest
from e2e.dagster_services import DagsterServices
from playwright.sync_api import Page, expect

import idem_assets as ia
from idem_assets import landing

from .conftest import Screenshots, metadata_value

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ASSET = "raw_trips"
FIRST_DAY = date(2026, 1, 1)
DAYS = [(FIRST_DAY + timedelta(days=i)).isoformat() for i in range(3)]
FIXED_DAY = DAYS[1]
#: The last day: the first one is also the label of the partitions bar, which this one is not.
SAME_DAY = DAYS[-1]
ROWS_PER_DAY = 100
CHANGED, REMOVED = 3, 2
RUN_TIMEOUT_S = 240.0


@pytest.fixture
def landing_dir(tmp_path: Path) -> Path:
    """Three days of 100 trips."""
    root = tmp_path / "landing"
    landing.generate(root, FIRST_DAY, date.fromisoformat(DAYS[-1]), rows=ROWS_PER_DAY)
    return root


def backfill(services: DagsterServices, tags: dict[str, str] | None = None) -> dict:
    """An asset backfill of raw_trips over the three days, as the UI launches one, to its end."""
    backfill_id = services.client.launch_partition_backfill(
        [ASSET], DAYS, location=services.location_name, tags=tags
    )
    return services.client.wait_for_backfill(backfill_id, timeout_s=RUN_TIMEOUT_S)


def stored(database: Path) -> str | None:
    """The fingerprint of raw_trips as stored, read without a writer lock."""
    with duckdb.connect(str(database), read_only=True) as conn:
        return ia.table_fingerprint(conn, "main", ASSET)


def test_a_planned_backfill_shows_each_day_s_changes_on_the_partitions_page(
    services: DagsterServices,
    page: Page,
    screenshots: Screenshots,
    landing_dir: Path,
    tmp_path: Path,
) -> None:
    shots = screenshots
    loaded = backfill(services)
    assert loaded["status"] == "COMPLETED_SUCCESS", loaded
    landing.correct(landing_dir, date.fromisoformat(FIXED_DAY), changed=CHANGED, removed=REMOVED)
    table = stored(tmp_path / "warehouse.duckdb")

    planned = backfill(services, dict(ia.PLAN_TAGS))
    # The three days are one chunk, so one run loaded them and one planned their rerun.
    (load_run,), (plan_run,) = loaded["run_ids"], planned["run_ids"]
    runs = services.client.runs_for_backfill(planned["id"])
    assert [run.status for run in runs] == ["SUCCESS"], (planned, runs)
    # Dagster's asset backfill counts a partition done once it is materialized, and a plan
    # materializes nothing: the backfill reads failed though its run succeeded.
    assert planned["status"] == "COMPLETED_FAILED", planned
    assert stored(tmp_path / "warehouse.duckdb") == table

    # Tall enough for the plan's entries, each with the run that observed it.
    page.set_viewport_size({"width": 1280, "height": 1200})
    with shots.step(page, "the corrected day: what its rerun would change"):
        page.goto(f"{services.url}/assets/{ASSET}?view=partitions")
        selection = page.locator(f"input[value^='[{DAYS[0]}']").first
        selection.fill(f"[{DAYS[0]}...{DAYS[-1]}]")
        selection.press("Enter")
        expect(page.get_by_text(f"{len(DAYS)} Partitions Selected")).to_be_visible()
        page.get_by_text(FIXED_DAY, exact=True).first.click()
        expect(metadata_value(page, "plan")).to_have_text("changes")
        # An overwrite compares rows by content: a changed trip is one deleted and one inserted.
        expect(metadata_value(page, "rows_inserted")).to_have_text(str(CHANGED))
        expect(metadata_value(page, "rows_deleted")).to_have_text(str(CHANGED + REMOVED))
        unchanged = ROWS_PER_DAY - CHANGED - REMOVED
        expect(metadata_value(page, "rows_unchanged")).to_have_text(str(unchanged))
        expect(metadata_value(page, "rows_after")).to_have_text(str(ROWS_PER_DAY - REMOVED))
        # Observed by the plan's run; the latest materialization is still the load's.
        expect(page.get_by_text(plan_run[:8]).first).to_be_visible()
        expect(page.get_by_role("link", name=load_run[:8])).to_be_visible()
    shots.publish(shots.taken[-1], "plan-partition.png")

    with shots.step(page, "an unchanged day: no change"):
        page.get_by_text(SAME_DAY, exact=True).first.click()
        expect(metadata_value(page, "plan")).to_have_text("no change")
        expect(metadata_value(page, "rows_inserted")).to_have_text("0")
        expect(metadata_value(page, "rows_deleted")).to_have_text("0")
        expect(metadata_value(page, "rows_unchanged")).to_have_text(str(ROWS_PER_DAY))
        before, after = (
            metadata_value(page, "fingerprint_before"),
            metadata_value(page, "fingerprint_after"),
        )
        expect(after).to_have_text(before.inner_text())
