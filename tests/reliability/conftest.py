"""Print what the reliability tests measured (kill counts, soak numbers) after the summary."""

import pytest

from .support import FULL, REPORT, SEED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not REPORT:
        return
    run = "full (IDEM_FULL=1)" if FULL else "default"
    terminalreporter.section(f"reliability report: {run} run, IDEM_SEED={SEED}")
    for line in REPORT:
        terminalreporter.write_line(line)
