"""Chromium for the browser tests, a page per test, and the screenshots taken along the way."""

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from e2e.dagster_services import DagsterServices
from playwright.sync_api import Browser, Locator, Page, ViewportSize, expect, sync_playwright
from playwright.sync_api import Error as PlaywrightError

from idem_assets import landing
from idem_assets.defs.partitions import DAILY

REPO_ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    # Root in a container has no user namespace for Chromium's sandbox.
    "--no-sandbox",
    "--disable-gpu",
    # No update checks, sync or QUIC probes: the tests must work with no internet at all.
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
]
VIEWPORT: ViewportSize = {"width": 1280, "height": 800}
UI_TIMEOUT_MS = 30_000
DOCS_SCREENSHOTS = REPO_ROOT / "docs" / "screenshots"
UPDATE_SCREENSHOTS_ENV = "IDEM_UPDATE_SCREENSHOTS"


class UiStepError(AssertionError):
    """A step in the UI failed; the message names the screenshot of the page at that moment."""


@dataclass
class Screenshots:
    """Numbered screenshots of one test's page, in a pytest tmp dir."""

    directory: Path
    taken: list[Path] = field(default_factory=list)

    def take(self, page: Page, name: str) -> Path:
        """Save the viewport as ``NN-name.png`` and return its path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{len(self.taken) + 1:02d}-{_slug(name)}.png"
        # Finish CSS transitions first, or a dialog or toast is caught half faded in.
        page.screenshot(path=str(path), animations="disabled")
        self.taken.append(path)
        return path

    def failed(self, page: Page, step_name: str, error: BaseException) -> UiStepError:
        """Screenshot the page as it is now and return an error that names the file."""
        try:
            path: Path | str = self.take(page, f"FAILED {step_name}")
        except PlaywrightError as screenshot_error:
            path = f"(no screenshot: {screenshot_error})"
        return UiStepError(f"UI step '{step_name}' failed; screenshot: {path}\n{error}")

    @contextmanager
    def step(self, page: Page, step_name: str) -> Iterator[None]:
        """Run one step; screenshot the page after it, or on failure name the screenshot."""
        try:
            yield
        except UiStepError:
            raise
        except (AssertionError, PlaywrightError) as error:
            raise self.failed(page, step_name, error) from error
        self.take(page, step_name)

    def expect_visible(
        self, page: Page, locator: Locator, step_name: str, timeout_ms: float = UI_TIMEOUT_MS
    ) -> None:
        """Wait until ``locator`` is visible; on timeout, screenshot and name the file."""
        try:
            expect(locator).to_be_visible(timeout=timeout_ms)
        except AssertionError as error:
            raise self.failed(page, step_name, error) from error

    def publish(self, source: Path, name: str) -> None:
        """Copy a screenshot to docs/screenshots when $IDEM_UPDATE_SCREENSHOTS is 1."""
        if os.environ.get(UPDATE_SCREENSHOTS_ENV) != "1":
            return
        DOCS_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        _save_small_png(source, DOCS_SCREENSHOTS / name)


def show_every_partition(page: Page, dialog: Locator, shots: Screenshots) -> None:
    """In a materialize dialog of the daily assets, ask for every day, not the last 90.

    The dialog offers only the last 90 days of more and renders that offer a moment after
    itself: whether to click is decided by the partitions, never by a look that may come early.
    """
    if len(DAILY.get_partition_keys()) > 90:
        show_all = dialog.get_by_role("button", name="Show all partitions")
        shots.expect_visible(page, show_all, "show all partitions")
        show_all.click()


def metadata_value(page: Page, label: str) -> Locator:
    """The value cell of a row of a metadata (or tags) table."""
    row = page.get_by_role("row").filter(has=page.get_by_role("cell", name=label, exact=True))
    return row.get_by_role("cell").nth(1)


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _save_small_png(source: Path, target: Path) -> None:
    """Write a 256-colour PNG when Pillow is installed, else the screenshot as it is."""
    try:
        from PIL import Image  # pyright: ignore[reportMissingImports]
    except ImportError:
        # A 1280x800 screenshot of the mostly white UI is already well under 150 KB.
        shutil.copyfile(source, target)
        return
    with Image.open(source) as image:
        image.convert("RGB").quantize(colors=256).save(target, optimize=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Keep each phase's report on the item so the page fixture can tell a failed test."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture(scope="session")
def chromium_executable() -> Path:
    """Debian's Chromium; skipped when absent locally, an error under CI."""
    if not os.access(CHROMIUM, os.X_OK):
        message = f"{CHROMIUM} is missing: run `make browser-deps` (or scripts/install_browser.sh)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI must run the browser tests.")
        pytest.skip(message)
    return CHROMIUM


# Package scope: Playwright's sync API keeps an event loop running until it stops, and Dagster
# code in later test packages calls asyncio.run(), which refuses to run inside a running loop.
@pytest.fixture(scope="package")
def browser(chromium_executable: Path) -> Iterator[Browser]:
    """One headless Chromium for the browser tests, closed even when a test fails."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(chromium_executable), args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def screenshots(tmp_path: Path) -> Screenshots:
    """Where this test's screenshots go."""
    return Screenshots(tmp_path / "screenshots")


@pytest.fixture
def page(
    browser: Browser, screenshots: Screenshots, request: pytest.FixtureRequest
) -> Iterator[Page]:
    """A fresh 1280x800 page; a failing test leaves a screenshot of where it stopped."""
    context = browser.new_context(viewport=VIEWPORT)
    context.set_default_timeout(UI_TIMEOUT_MS)
    expect.set_options(timeout=UI_TIMEOUT_MS)
    page = context.new_page()
    try:
        yield page
    finally:
        report = getattr(request.node, "report_call", None)
        if report is not None and report.failed:
            try:
                path = screenshots.take(page, "at failure")
                print(f"Screenshots of the failed test: {screenshots.directory} (last: {path})")
            except PlaywrightError:
                pass
        context.close()


@pytest.fixture
def services(tmp_path: Path, landing_dir: Path) -> Iterator[DagsterServices]:
    """The real code location under dagster-daemon and dagster-webserver, as `make dev` runs it.

    Each test module gives the ``landing_dir`` its days come from.
    """
    services = DagsterServices(
        dagster_home=tmp_path / "dagster_home",
        dagster_yaml=(REPO_ROOT / "dagster.yaml").read_text(),
        module="idem_assets.definitions",
        working_directory=REPO_ROOT,
        env={
            landing.LANDING_DIR_ENV: str(landing_dir),
            "IDEM_DUCKDB_PATH": str(tmp_path / "warehouse.duckdb"),
        },
        backfill_interval_seconds=1.0,
    )
    services.start()
    try:
        services.client.execute("mutation { setNuxSeen }")  # the sign-up dialog's "Skip"
        yield services
    finally:
        services.stop()
    assert services.leftover_processes() == []
