"""The Dagster UI as users use it: the lineage, a backfill, a failed blocking check, metadata."""

import re
import time
from collections.abc import Iterator, Mapping
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from e2e.dagster_services import TERMINAL_RUN_STATUSES, DagsterServices, ServicesError
from e2e.readme import dagster_commands
from playwright.sync_api import Locator, Page, expect

from idem_assets import landing
from idem_assets.defs.partitions import DAILY, GROUP
from tests.defs.support import MadeDemo, run_dev_data

from .conftest import REPO_ROOT, Screenshots, show_every_partition

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WORKSPACE = REPO_ROOT / "workspace.yaml"
ASSETS = ("raw_trips", "trips", "daily_zone_revenue", "revenue_running_total")

#: The taxi group's own lineage. The global lineage collapses each group into one box once the
#: location has more than one group (the revenue report has its own), so users and tests open
#: the group.
TAXI_LINEAGE = f"/locations/__repository__@idem_assets/asset-groups/{GROUP}"
FIRST_DAY = date(2026, 1, 1)
BAD_DAY = date(2026, 1, 6)
ROWS_PER_DAY = 100
BAD_ROWS = 2
BACKFILL_RANGE = "[2026-01-01...2026-01-05]"
SHOWN_RANGE = "[2026-01-01...2026-01-06]"
BLOCKING_CHECK = "passenger_count_between_1_and_6"
RUN_TIMEOUT_S = 180.0
#: The days of docs/backfills.md's `dagster job backfill` command.
CLI_DAYS = ["2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04", "2026-01-05"]

_RUNS_BY_TAG = """
query RunsByTag($filter: RunsFilter!) {
  runsOrError(filter: $filter) {
    __typename
    ... on Runs { results { runId status } }
    ... on PythonError { message }
  }
}
"""

_STEP_FAILURES = """
query StepFailures($runId: ID!) {
  logsForRun(runId: $runId) {
    ... on EventConnection {
      events { ... on ExecutionStepFailureEvent { stepKey error { message } } }
    }
  }
}
"""


@pytest.fixture
def landing_dir(tmp_path: Path) -> Path:
    """Six days of 100 trips; the last day has two passenger counts outside 1..6."""
    root = tmp_path / "landing"
    landing.generate(root, FIRST_DAY, BAD_DAY, rows=ROWS_PER_DAY)
    landing.add_bad_passengers(root, BAD_DAY, BAD_ROWS)
    return root


@pytest.fixture
def services(tmp_path: Path, landing_dir: Path) -> Iterator[DagsterServices]:
    """The real code location under dagster-daemon and dagster-webserver."""
    services = DagsterServices(
        dagster_home=tmp_path / "dagster_home",
        # The instance settings `make dev` uses: the run queue and one slot for the pool of
        # DuckDB writers, so no two runs hold the warehouse file at once.
        dagster_yaml=(REPO_ROOT / "dagster.yaml").read_text(),
        workspace=WORKSPACE,
        env={
            landing.LANDING_DIR_ENV: str(landing_dir),
            "IDEM_DUCKDB_PATH": str(tmp_path / "warehouse.duckdb"),
        },
        backfill_interval_seconds=1.0,
    )
    services.start()
    try:
        # On localhost a new instance greets the user with a community sign-up dialog a second
        # after the first page loads, over whatever is being clicked; this is its "Skip".
        services.client.execute("mutation { setNuxSeen }")
        yield services
    finally:
        services.stop()
    assert services.leftover_processes() == []


def metadata_value(page: Page, label: str) -> Locator:
    """The value cell of a row of a metadata table."""
    row = page.get_by_role("row").filter(has=page.get_by_role("cell", name=label, exact=True))
    return row.get_by_role("cell").nth(1)


def open_materialize_all(page: Page, url: str, partitions: str, shots: Screenshots) -> Locator:
    """Open the lineage's "Materialize all…" dialog and type a partition selection into it."""
    page.goto(f"{url}{TAXI_LINEAGE}")
    page.get_by_role("button", name="Materialize all…").click()
    dialog = page.get_by_role("dialog").filter(has_text="Launch runs to materialize 4 assets")
    shots.expect_visible(page, dialog, "materialize dialog")
    selection = dialog.get_by_role("textbox")
    shots.expect_visible(page, selection, "partition selection")
    show_every_partition(page, dialog, shots)
    selection.fill(partitions)
    selection.press("Enter")
    return dialog


def select_partitions(page: Page, url: str, asset: str, partitions: str) -> None:
    """Open an asset's partitions view and type a range into its partition selection."""
    page.goto(f"{url}/assets/{asset}?view=partitions")
    # The selection box shows the whole range, e.g. [2026-01-01...2026-11-28]; the name filter
    # below it is the other textbox.
    selection = page.get_by_role("textbox").first
    expect(selection).to_have_value(re.compile(r"^\[2026-01-01\.\.\."))
    selection.fill(partitions)
    selection.press("Enter")


def wait_for_runs(
    services: DagsterServices, tags: Mapping[str, str], timeout_s: float
) -> list[dict[str, Any]]:
    """Wait until at least one run carries ``tags`` and every such run has finished."""
    variables = {"filter": {"tags": [{"key": k, "value": v} for k, v in tags.items()]}}
    deadline = time.monotonic() + timeout_s
    runs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        runs = services.client.execute(_RUNS_BY_TAG, variables)["runsOrError"]["results"]
        if runs and all(run["status"] in TERMINAL_RUN_STATUSES for run in runs):
            return runs
        time.sleep(0.5)
    raise ServicesError(f"Runs tagged {dict(tags)} not finished after {timeout_s:.0f}s: {runs}")


def step_failures(services: DagsterServices, run_id: str) -> list[str]:
    """The error message of each failed step of a run, for assertion messages."""
    events = services.client.execute(_STEP_FAILURES, {"runId": run_id})["logsForRun"]["events"]
    return [event["error"]["message"].strip() for event in events if event.get("error")]


def test_ui_backfill_blocking_check_and_publish_metadata(
    services: DagsterServices, page: Page, screenshots: Screenshots
) -> None:
    assert (DAILY.get_last_partition_key() or "") >= BAD_DAY.isoformat(), (
        f"The daily partitions reach {BAD_DAY} only once that day has ended (UTC)"
    )
    url = services.url
    shots = screenshots

    with shots.step(page, "lineage shows the four assets"):
        page.goto(f"{url}{TAXI_LINEAGE}")
        for asset in ASSETS:
            shots.expect_visible(page, page.get_by_text(asset, exact=True).first, f"node {asset}")

    with shots.step(page, "backfill preview"):
        dialog = open_materialize_all(page, url, BACKFILL_RANGE, shots)
        shots.expect_visible(page, dialog.get_by_text("5 partitions", exact=True), "5 selected")
        dialog.get_by_role("button", name="Preview").click()
        preview = page.get_by_role("dialog").filter(has_text="Backfill preview")
        shots.expect_visible(page, preview, "backfill preview")
        expect(preview.get_by_text("2026-01-01...2026-01-05", exact=True)).to_have_count(4)
    shots.publish(shots.taken[-1], "backfill-preview.png")

    with shots.step(page, "backfill launched"):
        preview.get_by_role("button", name="OK").click()
        dialog.get_by_role("button", name="Launch backfill").click()
        toast = page.get_by_text(re.compile(r"^Created backfill \w+$"))
        shots.expect_visible(page, toast, "backfill toast")
        match = re.search(r"Created backfill (\w+)", toast.first.inner_text())
        assert match, toast.first.inner_text()
        backfill_id = match.group(1)

    result = services.client.wait_for_backfill(backfill_id, timeout_s=RUN_TIMEOUT_S)
    with shots.step(page, "backfill finished"):
        page.goto(f"{url}/runs/b/{backfill_id}")
        shots.expect_visible(page, page.get_by_text(BACKFILL_RANGE[1:-1]).first, "backfill page")
        assert result["status"] == "COMPLETED_SUCCESS", (
            f"Backfill {backfill_id} ended {result['status']}: {result['error']}\n"
            + "".join(
                f"  run {run.run_id[:8]} ({run.partition}): {run.status}"
                f" {step_failures(services, run.run_id)}\n"
                for run in services.client.runs_for_backfill(backfill_id)
            )
        )
        # The status badge; the table's "Succeeded" column header is a link.
        badge = page.get_by_text("Succeeded", exact=True).and_(page.locator("span"))
        shots.expect_visible(page, badge, "backfill status")

    with shots.step(page, "raw_trips partitions after the backfill"):
        select_partitions(page, url, "raw_trips", SHOWN_RANGE)
        shots.expect_visible(page, page.get_by_text("Materialized (5)"), "5 materialized")
        shots.expect_visible(page, page.get_by_text("Missing (1)"), "bad day still missing")
    shots.publish(shots.taken[-1], "backfill-partitions.png")

    with shots.step(page, "bad day launched"):
        dialog = open_materialize_all(page, url, BAD_DAY.isoformat(), shots)
        shots.expect_visible(page, dialog.get_by_text("1 partition", exact=True), "1 selected")
        dialog.get_by_role("button", name="Launch 1 run").click()
        shots.expect_visible(page, page.get_by_text(re.compile(r"^Launched run")), "run toast")

    runs = wait_for_runs(services, {"dagster/partition": BAD_DAY.isoformat()}, RUN_TIMEOUT_S)
    assert [run["status"] for run in runs] == ["FAILURE"], runs

    with shots.step(page, "blocking check failed with its sample"):
        page.goto(f"{url}/assets/raw_trips?view=checks")
        # The list shows long names middle-truncated; the full name is the item's title.
        page.get_by_title(BLOCKING_CHECK).first.click()
        shots.expect_visible(
            page, page.get_by_text(re.compile(r"This is a\s+blocking\s+asset check")), "blocking"
        )
        expect(metadata_value(page, "failing")).to_have_text(str(BAD_ROWS))
        expect(metadata_value(page, "detail")).to_have_text(f"{BAD_ROWS} failing row(s)")
        evaluation = page.locator("div").filter(
            has_text=re.compile(r"^Evaluation result\s*Failed$")
        )
        shots.expect_visible(page, evaluation.first, "evaluation result Failed")
        metadata_value(page, "failing_sample").get_by_text("[Show Markdown]").click()
        sample = page.get_by_role("dialog").filter(has_text="failing_sample")
        shots.expect_visible(page, sample, "failing_sample dialog")
        # A header and one row per failing trip, all of the bad day.
        expect(sample.get_by_role("row")).to_have_count(BAD_ROWS + 1)
        expect(sample.get_by_role("cell", name=re.compile(r"^T20260106-\d+$"))).to_have_count(
            BAD_ROWS
        )
    shots.publish(shots.taken[-1], "blocking-check-failed.png")

    with shots.step(page, "trips not materialized for the bad day"):
        page.get_by_role("button", name="Close").click()
        select_partitions(page, url, "trips", SHOWN_RANGE)
        shots.expect_visible(page, page.get_by_text("Materialized (5)"), "trips 5 materialized")
        page.get_by_text(BAD_DAY.isoformat(), exact=True).first.click()
        shots.expect_visible(
            page, page.get_by_text("did not materialize this asset"), "trips bad day not written"
        )

    with shots.step(page, "publish metadata of a materialization"):
        page.goto(f"{url}/assets/trips?view=events")
        page.get_by_text("2026-01-05", exact=True).first.click()
        shots.expect_visible(
            page,
            page.get_by_text(re.compile(r"Partition\s+2026-01-05\s+materialized in run")),
            "materialization event",
        )
        expect(metadata_value(page, "dagster/row_count")).to_have_text(str(ROWS_PER_DAY))
        for label in ("rows_inserted", "rows_updated", "rows_deleted"):
            expect(metadata_value(page, label)).to_have_text(re.compile(r"^\d[\d,]*$"))
        expect(metadata_value(page, "rows_updated")).to_have_text("0")
        expect(metadata_value(page, "rows_deleted")).to_have_text("0")


#: Counts the pixels of a chart's canvas drawn in colour: a plotted series is coloured, while an
#: empty chart has only grey axes and grid lines.
_COLOURED_PIXELS = """
(canvas) => {
  const {data} = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height);
  let coloured = 0;
  for (let i = 0; i < data.length; i += 4) {
    const [r, g, b, a] = [data[i], data[i + 1], data[i + 2], data[i + 3]];
    if (a > 0 && Math.max(r, g, b) - Math.min(r, g, b) > 60) coloured += 1;
  }
  return coloured;
}
"""


@pytest.fixture
def after_make_demo(made_demo: MadeDemo, tmp_path: Path) -> Iterator[DagsterServices]:
    """`make demo`, then `make dev`'s data step and services, all on folders of this test."""
    assert made_demo.process.returncode == 0, made_demo.process.stdout + made_demo.process.stderr
    demo = made_demo.copy_to(tmp_path)
    services = DagsterServices(
        dagster_home=demo.home,
        dagster_yaml=(REPO_ROOT / "dagster.yaml").read_text(),
        workspace=WORKSPACE,
        env={
            landing.LANDING_DIR_ENV: str(demo.landing),
            "IDEM_DUCKDB_PATH": str(demo.database),
        },
        backfill_interval_seconds=1.0,
    )
    run_dev_data(demo.landing)
    services.start()
    try:
        services.client.execute("mutation { setNuxSeen }")
        yield services
    finally:
        services.stop()
    assert services.leftover_processes() == []


def runs_of(services: DagsterServices, backfill_id: str) -> dict[str, str]:
    """Each run of a backfill by its partition (or range), with its status."""
    return {
        run.partition or run.run_id: run.status
        for run in services.client.runs_for_backfill(backfill_id)
    }


#: The first backfill from the UI, chosen after *All* in the dialog, of every partition as
#: docs/code-location.md's first hour does: eleven chunk runs and 9,000 events, the only way to
#: put points in the plots of the last 120 days. It runs under make test-full alone: make test
#: proves the dialog, queue and chunking through test_ui_backfill_blocking_check_and_publish_
#: metadata and the browser tests of check and plan partitions, and runs the printed CLI
#: backfill in tests/e2e/test_first_hour.py; a narrowed copy of this one was the suite's
#: longest test (500 s of a loaded run).
@pytest.mark.full
def test_first_hour_ui_backfill_plots_and_the_readme_cli_backfill(
    after_make_demo: DagsterServices, page: Page, screenshots: Screenshots
) -> None:
    services, url, shots = after_make_demo, after_make_demo.url, screenshots
    every_day = DAILY.get_partition_keys()

    with shots.step(page, "first backfill from the UI, all partitions"):
        page.goto(f"{url}{TAXI_LINEAGE}")
        page.get_by_role("button", name="Materialize all…").click()
        dialog = page.get_by_role("dialog").filter(has_text="Launch runs to materialize 4 assets")
        shots.expect_visible(page, dialog, "materialize dialog")
        # "All" is every partition once the dialog shows more than its last 90 days; `make dev`
        # gave every day a file. (The last 90 alone would fail revenue_running_total, whose
        # earlier days' revenue was never loaded: its error names the days to load first.)
        dialog.get_by_role("button", name="All", exact=True).click()
        show_every_partition(page, dialog, shots)
        everything = f"{len(every_day)} partitions"
        shots.expect_visible(page, dialog.get_by_text(everything, exact=True), everything)
        dialog.get_by_role("button", name="Launch backfill").click()
        toast = page.get_by_text(re.compile(r"^Created backfill \w+$"))
        shots.expect_visible(page, toast, "backfill toast")
        match = re.search(r"Created backfill (\w+)", toast.first.inner_text())
        assert match, toast.first.inner_text()
        ui_backfill = match.group(1)

    # Off the lineage while the runs go: its live queries of every partition's status kept the
    # webserver as busy as the runs themselves.
    page.goto("about:blank")
    result = services.client.wait_for_backfill(ui_backfill, timeout_s=1800, poll_interval_s=2.0)
    assert result["status"] == "COMPLETED_SUCCESS", (result, runs_of(services, ui_backfill))
    # Chunks of 31 days, each of the four assets with its running totals; every one succeeded.
    runs = runs_of(services, ui_backfill)
    assert set(runs.values()) == {"SUCCESS"}, runs
    assert "2026-01-01...2026-01-31" in runs, runs

    with shots.step(page, "raw_trips partitions all materialized"):
        page.goto(f"{url}/assets/raw_trips?view=partitions")
        materialized = f"Materialized ({len(every_day)})"
        shots.expect_visible(page, page.get_by_text(materialized), materialized)

    with shots.step(page, "partition plots show the last 120 days"):
        # The overview's metadata section, switched from its table to its plots by partition.
        page.goto(f"{url}/assets/raw_trips")
        page.get_by_role("button", name=re.compile(r"Plots$")).first.click()
        heading = page.get_by_text("dagster/row_count", exact=True)
        shots.expect_visible(page, heading, "row_count plot")
        canvas = page.locator("canvas").first
        shots.expect_visible(page, canvas, "plot canvas")
        deadline = time.monotonic() + 30
        coloured = 0
        while coloured == 0 and time.monotonic() < deadline:
            page.wait_for_timeout(500)
            coloured = canvas.evaluate(_COLOURED_PIXELS)
        assert coloured > 0, "the row_count plot has no points"
    shots.publish(shots.taken[-1], "partition-plots.png")

    (backfill_command,) = [c for c in dagster_commands() if c.startswith("dagster job backfill")]
    done = services.run_shell(backfill_command)
    assert done.returncode == 0, done.stdout + done.stderr
    match = re.search(r"Launched backfill job `(\w+)`", done.stdout)
    assert match, done.stdout
    cli_backfill = match.group(1)
    services.client.wait_for_backfill(cli_backfill, timeout_s=600)
    # The CLI's backfill reads Completed as soon as its runs are queued: the runs are the verdict.
    assert runs_of(services, cli_backfill) == dict.fromkeys(CLI_DAYS, "SUCCESS")

    with shots.step(page, "the CLI backfill in the UI, its five runs succeeded"):
        page.goto(f"{url}/runs?q%5B0%5D=tag%3Adagster%2Fbackfill%3D{cli_backfill}")
        shots.expect_visible(page, page.get_by_text(cli_backfill).first, "the CLI backfill")
        shots.expect_visible(page, page.get_by_text("5 partitions").first, "its five days")
        page.get_by_text("Show runs within backfills").click()
        for day in CLI_DAYS:
            shots.expect_visible(page, page.get_by_text(f"partition: {day}"), f"run of {day}")
        expect(page.get_by_text("Success", exact=True)).to_have_count(len(CLI_DAYS))
    shots.publish(shots.taken[-1], "cli-backfill-runs.png")
