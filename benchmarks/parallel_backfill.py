"""A one-run-per-day backfill with the warehouse pool at 3 slots against 1, through the daemon.

Each case starts a throwaway PostgreSQL, deploy/'s Postgres-backed instance (the stock daemon,
webserver and a gRPC code server) with the taxi location on the chosen warehouse, and launches
`dagster job backfill -j taxi_daily` over the days, as tests/e2e/test_parallel_backfill.py does:

    python benchmarks/parallel_backfill.py                  # 31 days: Postgres 3 and 1, DuckDB 1
    python benchmarks/parallel_backfill.py --days 9 --repeat 1 --save out.json

DuckDB takes one writer process per file, so its pool has one slot: the DuckDB row is the same
backfill on the default warehouse. Wall time runs from the launch to the end of the last run; the
1-minute load average before each case is printed with it, since the machine may be shared.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "tests"))

from postgres_server import PostgresServer, find_bin_dir  # noqa: E402

from idem_assets.defs.partitions import DAILY  # noqa: E402
from tests.e2e.parallel_backfill import (  # noqa: E402
    backfill_one_run_per_day,
    day_state,
    postgres_stack,
    stale_running_totals,
)

#: (label, warehouse engine, pool slots)
CASES = (("postgres, 3 slots", "postgres", 3), ("postgres, 1 slot", "postgres", 1))
DUCKDB = ("duckdb, 1 slot", "duckdb", 1)


def one_case(
    server: PostgresServer, engine: str, slots: int, days: list[str], rows: int
) -> dict[str, Any]:
    """Run one backfill on fresh services and a fresh warehouse; return its measurements."""
    work = Path(tempfile.mkdtemp(prefix="parallel-bench-"))
    try:
        stack = postgres_stack(server, work, engine, days, rows)
        load = os.getloadavg()[0]
        with stack.services:
            backfill = backfill_one_run_per_day(stack, days, slots, timeout_s=3600)
            state = day_state(stack, days)
            _, stale = stale_running_totals(stack)
        assert {r.status for r in backfill.records} == {"SUCCESS"}, backfill.records
        assert stale == [], stale
        return {
            "engine": engine,
            "slots": slots,
            "days": len(days),
            "runs": len(backfill.records),
            "wall_s": backfill.wall_s,
            "in_progress_at_once": backfill.overlap,
            "load_before": round(load, 2),
            "rows": sum(s[0] for s in state.values() if s is not None),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def table(samples: dict[str, list[dict[str, Any]]]) -> str:
    """Medians side by side, each as a ratio of the 3-slot Postgres backfill."""
    base = statistics.median(s["wall_s"] for s in samples[CASES[0][0]])
    lines = [
        "| one run per day | wall s (median) | ratio to postgres, 3 slots | runs at once | samples;"
        " highest 1-min load |",
        "|---|---:|---:|---:|---|",
    ]
    for label, group in samples.items():
        wall = statistics.median(s["wall_s"] for s in group)
        lines.append(
            f"| {label} | {wall:.1f} | {wall / base:.2f} |"
            f" {max(s['in_progress_at_once'] for s in group)} |"
            f" {len(group)}; {max(s['load_before'] for s in group)} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--days", type=int, default=31)
    parser.add_argument("--rows", type=int, default=1000, help="trips per day")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-duckdb", action="store_true", help="skip the DuckDB backfill")
    parser.add_argument("--save", type=Path, default=None, help="write the samples as JSON")
    args = parser.parse_args()
    days = list(DAILY.get_partition_keys()[: args.days])
    cases = [*CASES] if args.no_duckdb else [*CASES, DUCKDB]
    samples: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in cases}
    with PostgresServer.start(find_bin_dir()) as server:
        # Interleaved, so a change in the machine's load touches every case alike.
        for _ in range(args.repeat):
            for label, engine, slots in cases:
                sample = one_case(server, engine, slots, days, args.rows)
                print(json.dumps({"case": label, **sample}), flush=True)
                samples[label].append(sample)
    if args.save:
        args.save.write_text(json.dumps(samples, indent=1))
    print(table(samples))


if __name__ == "__main__":
    main()
