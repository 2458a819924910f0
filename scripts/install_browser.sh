#!/usr/bin/env bash
# Install Debian's Chromium for the browser tests (tests/browser).
# Playwright drives /usr/bin/chromium directly: nothing is downloaded at test time, and
# `playwright install` is never run. Safe to run again: it does nothing once Chromium is there.
set -euo pipefail

CHROMIUM=/usr/bin/chromium

if [ -x "$CHROMIUM" ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "Chromium is missing, so the browser tests will be skipped (under CI=true they fail)." >&2
  echo "Install it with:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y chromium" >&2
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y chromium
test -x "$CHROMIUM"
