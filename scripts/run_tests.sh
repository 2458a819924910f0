#!/usr/bin/env bash
# Run the whole suite. pytest exits 5 when it collected no test: that is a failure here.
set -uo pipefail
cd "$(dirname "$0")/.."
# The slowest tests, so the suite can be kept inside its time budget as it grows.
.venv/bin/python -m pytest --durations=30 "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: failing the run" >&2
  exit 1
fi
exit "$status"
