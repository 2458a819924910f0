#!/usr/bin/env bash
# Install Debian's Java runtime for the Spark engine (pyspark 4 needs Java 17 or newer; its JVM
# runs the tests' local[2] sessions and their embedded Hive metastore). Safe to run again: it
# does nothing once `java -version` reports 17 or newer.
set -euo pipefail

java_ok() {
  command -v java >/dev/null 2>&1 &&
    java -version 2>&1 | head -1 | grep -Eq 'version "(1[7-9]|[2-9][0-9])'
}

if java_ok; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "Java 17 or newer is missing; the Spark engine and its tests need it. Install it with:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y openjdk-17-jre-headless" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y openjdk-17-jre-headless
java_ok
