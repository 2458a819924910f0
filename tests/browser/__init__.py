"""Browser tests: Playwright drives Debian's Chromium through the real Dagster UI."""
