#!/usr/bin/env bash
# Install Debian's PostgreSQL server for the tests that start a throwaway cluster
# (tests/postgres_server.py). Only the binaries are needed: the tests run initdb in a temp dir,
# so Debian's own cluster is neither used nor started. Safe to run again: it does nothing once
# initdb is there.
set -euo pipefail

if compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "PostgreSQL is missing, so the PostgreSQL tests will be skipped (under CI=true they fail)." >&2
  echo "Install it with:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y postgresql" >&2
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y postgresql
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
