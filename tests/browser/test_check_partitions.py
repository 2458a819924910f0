"""The per-day check view in the Dagster UI: a chunk's bad day red, its failed days retried.

Two days of raw_trips are published as one chunk; the next chunk of three days fails on its middle
day. The check's partition view shows that day red and the others green, the failed days are
backfilled again from the UI after the input is fixed, and the data version of the new
materialization is the content fingerprint of the window it published.
"""

import re
from datetime import date, timedelta
from pathlib import Path

import duckdb
import pytest
from e2e.dagster_services import DagsterServices
from playwright.sync_api import Locator, Page, expect

import idem_assets as ia
from idem_assets import landing
from idem_assets.defs.partitions import DAILY

from .conftest import Screenshots, metadata_value, show_every_partition

pytestmark = [pytest.mark.browser, pytest.mark.slow]

FIRST_DAY = date(2026, 1, 1)
DAYS = [(FIRST_DAY + timedelta(days=i)).isoformat() for i in range(5)]
BAD_DAY = DAYS[3]
ROWS_PER_DAY = 100
BAD_ROWS = 2
SHOWN_RANGE = f"[{DAYS[0]}...{DAYS[-1]}]"
BLOCKING_CHECK = "passenger_count_between_1_and_6"
RUN_TIMEOUT_S = 240.0


@pytest.fixture
def landing_dir(tmp_path: Path) -> Path:
    """Five days of 100 trips; the fourth has two passenger counts outside 1..6."""
    root = tmp_path / "landing"
    landing.generate(root, FIRST_DAY, date.fromisoformat(DAYS[-1]), rows=ROWS_PER_DAY)
    landing.add_bad_passengers(root, date.fromisoformat(BAD_DAY), BAD_ROWS)
    return root


def backfill(services: DagsterServices, days: list[str]) -> dict:
    """An asset backfill of raw_trips, launched as the UI launches one, run to the end."""
    backfill_id = services.client.launch_partition_backfill(
        ["raw_trips"], days, location=services.location_name
    )
    return services.client.wait_for_backfill(backfill_id, timeout_s=RUN_TIMEOUT_S)


def open_check_partitions(page: Page, url: str) -> None:
    """The blocking check's Partitions tab, narrowed to the test's days."""
    page.goto(f"{url}/assets/raw_trips?view=checks&checkDetail={BLOCKING_CHECK}")
    page.locator("button[role=tab]", has_text="Partitions").click()
    selection = page.locator("input[value^='[2026-01-01']").first
    selection.fill(SHOWN_RANGE)
    selection.press("Enter")
    expect(page.get_by_text("5 Partitions Selected")).to_be_visible()


def status_count(page: Page, status: str) -> Locator:
    """The count next to a status filter of the partitions view, e.g. 'Failed (1)'."""
    return page.get_by_text(re.compile(rf"^{status}\s*\(\d+\)$"))


def window_fingerprint(database: Path, days: list[str]) -> str:
    """The content fingerprint of raw_trips over ``days``, read without a writer lock."""
    conn = duckdb.connect(str(database), read_only=True)
    try:
        window = ia.window_from_keys(DAILY, days, "raw_trips")
        found = ia.table_fingerprint(conn, "main", "raw_trips", "pickup_at", window)
    finally:
        conn.close()
    assert found is not None
    return found


def test_a_chunk_shows_its_bad_day_red_and_its_failed_days_are_retried_from_the_ui(
    services: DagsterServices,
    page: Page,
    screenshots: Screenshots,
    landing_dir: Path,
    tmp_path: Path,
) -> None:
    assert (DAILY.get_last_partition_key() or "") >= DAYS[-1]
    url = services.url
    shots = screenshots
    assert backfill(services, DAYS[:2])["status"] == "COMPLETED_SUCCESS"
    assert backfill(services, DAYS[2:])["status"] == "COMPLETED_FAILED"

    with shots.step(page, "the check's days: the bad day red, the others green"):
        open_check_partitions(page, url)
        expect(status_count(page, "Failed")).to_have_text(re.compile(r"\(1\)$"))
        expect(status_count(page, "Passed")).to_have_text(re.compile(r"\(4\)$"))
        page.get_by_text(BAD_DAY, exact=True).first.click()
        shots.expect_visible(page, page.get_by_text("Target materialization"), "bad day detail")
        expect(metadata_value(page, "failing")).to_have_text(str(BAD_ROWS))
        expect(metadata_value(page, "detail")).to_have_text(f"{BAD_ROWS} failing row(s)")
        expect(metadata_value(page, "judged")).to_contain_text(
            f"refused before any write because a blocking check failed on {BAD_DAY}"
        )
        # Nothing of the chunk was published, so the verdict points at no materialization.
        target = page.get_by_text("Target materialization").locator("..")
        expect(target).to_contain_text("None")
    shots.publish(shots.taken[-1], "check-partitions.png")

    with shots.step(page, "a good day of the refused chunk passed"):
        page.get_by_text(DAYS[2], exact=True).first.click()
        expect(metadata_value(page, "failing")).to_have_text("0")
        expect(metadata_value(page, "detail")).to_have_text("0 failing row(s)")

    # The source resends the day, correct this time.
    day = date.fromisoformat(BAD_DAY)
    landing.generate(landing_dir, day, day, rows=ROWS_PER_DAY)

    with shots.step(page, "the failed days selected for a backfill"):
        page.goto(f"{url}/assets/raw_trips?view=partitions")
        page.get_by_role("button", name="Materialize…").first.click()
        dialog = page.get_by_role("dialog").filter(has_text="Launch runs to materialize raw_trips")
        shots.expect_visible(page, dialog, "materialize dialog")
        show_every_partition(page, dialog, shots)
        dialog.get_by_role("button", name="Failed", exact=True).click()
        # The chunk was refused as a whole, so its three days are the failed ones; the two
        # published days are not selected.
        shots.expect_visible(page, dialog.get_by_text("3 partitions", exact=True), "3 failed")
    shots.publish(shots.taken[-1], "retry-failed-days.png")

    with shots.step(page, "the retry launched"):
        dialog.get_by_role("button", name="Launch backfill").click()
        toast = page.get_by_text(re.compile(r"^Created backfill \w+$"))
        shots.expect_visible(page, toast, "backfill toast")
        match = re.search(r"Created backfill (\w+)", toast.first.inner_text())
        assert match, toast.first.inner_text()

    retry = services.client.wait_for_backfill(match.group(1), timeout_s=RUN_TIMEOUT_S)
    assert retry["status"] == "COMPLETED_SUCCESS", retry
    assert len(retry["run_ids"]) == 1
    retried = services.client.runs_for_backfill(match.group(1))
    assert [run.partition for run in retried] == [f"{DAYS[2]}...{DAYS[-1]}"]

    with shots.step(page, "every day green after the retry"):
        open_check_partitions(page, url)
        expect(status_count(page, "Failed")).to_have_text(re.compile(r"\(0\)$"))
        expect(status_count(page, "Passed")).to_have_text(re.compile(r"\(5\)$"))

    version = window_fingerprint(tmp_path / "warehouse.duckdb", DAYS[2:])
    with shots.step(page, "the data version of the retried day is its content"):
        page.goto(f"{url}/assets/raw_trips?view=events")
        page.get_by_text(BAD_DAY, exact=True).first.click()
        shots.expect_visible(
            page,
            page.get_by_text(re.compile(rf"Partition\s+{BAD_DAY}\s+materialized in run")),
            "materialization event",
        )
        page.get_by_text(re.compile(r"^Show tags")).click()
        expect(metadata_value(page, "data_version")).to_have_text(version)
        expect(metadata_value(page, "data_version_is_user_provided")).to_have_text("true")
        metadata_value(page, "data_version").scroll_into_view_if_needed()
    shots.publish(shots.taken[-1], "data-version.png")
