"""Wall time of backfills through the real daemon: one run per partition vs chunked.

Each case starts dagster-daemon and dagster-webserver on a private DAGSTER_HOME (the e2e harness),
generates the landing files, launches one backfill and prints one JSON line:

    python benchmarks/backfill_wall_time.py              # 15 days of raw_trips, both modes
    python benchmarks/backfill_wall_time.py --mode per-partition --executor in_process
    python benchmarks/backfill_wall_time.py --days 365 --rows 1000 --mode chunked --assets group

"wall_s" runs from the launch to the end of the last run. The backfill daemon ticks every second
here (30 s in a stock daemon), so an asset backfill's real wall time adds up to one tick per
dependency level. Timings on a shared 2-core machine vary by a factor of up to two.
"""

import argparse
import json
import shutil
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from idem_assets import landing  # noqa: E402
from idem_assets.defs.partitions import WAREHOUSE_POOL  # noqa: E402
from tests.e2e.dagster_services import DagsterServices  # noqa: E402
from tests.e2e.test_backfills import (  # noqa: E402
    GROUP,
    IN_PROCESS,
    MODULE,
    launch_one_run_per_partition,
    run_events,
    summary,
    wait_for_runs,
)

MULTIPROCESS: dict[str, Any] = {"execution": {"config": {"multiprocess": {}}}}
FIRST_DAY = date(2026, 1, 1)


def instance_yaml(granularity: str, op_run_buffer: int | None) -> str:
    """The repository's dagster.yaml with the pool granularity under test and a 1 s queue poll."""
    config = yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())
    pools = config["concurrency"]["pools"]
    pools["granularity"] = granularity
    if op_run_buffer is not None:
        pools["op_granularity_run_buffer"] = op_run_buffer
    config["run_queue"] = {"dequeue_interval_seconds": 1}
    return yaml.safe_dump(config, sort_keys=False)


def run_case(args: argparse.Namespace) -> dict[str, Any]:
    """Start the services, run one backfill, return its measurements."""
    work = Path(tempfile.mkdtemp(prefix="backfill-bench-"))
    partitions = [(FIRST_DAY + timedelta(days=i)).isoformat() for i in range(args.days)]
    assets = GROUP if args.assets == "group" else [args.assets]
    try:
        started = time.monotonic()
        landing.generate(
            work / "landing", FIRST_DAY, FIRST_DAY + timedelta(args.days - 1), args.rows
        )
        generate_s = time.monotonic() - started
        services = DagsterServices(
            dagster_home=work / "dagster_home",
            dagster_yaml=instance_yaml(args.granularity, args.op_run_buffer),
            module=MODULE,
            working_directory=REPO_ROOT,
            env={
                "IDEM_LANDING_DIR": str(work / "landing"),
                "IDEM_DUCKDB_PATH": str(work / "warehouse.duckdb"),
            },
            backfill_interval_seconds=args.tick,
        )
        with services:
            # Dagster 1.13 applies pools.default_limit only after the first dequeue pass.
            services.run_cli(["instance", "concurrency", "set", WAREHOUSE_POOL, "1"])
            launched_at = time.time()
            if args.mode == "per-partition":
                run_config = IN_PROCESS if args.executor == "in_process" else MULTIPROCESS
                backfill_id = launch_one_run_per_partition(services, assets, partitions, run_config)
                records = wait_for_runs(services, backfill_id, len(partitions), args.timeout)
            else:
                backfill_id = services.client.launch_partition_backfill(
                    assets, partitions, location=services.location_name
                )
                services.client.wait_for_backfill(backfill_id, timeout_s=args.timeout)
                records = services.client.runs_for_backfill(backfill_id)
            events = {r.run_id: run_events(services.client, r.run_id) for r in records}
        result = summary(records, events, launched_at)
        result["statuses"] = sorted({r.status for r in records})
        result["run_s"] = {
            r.partition or r.run_id: round(r.end_time - r.start_time, 1)
            for r in records
            if r.start_time is not None and r.end_time is not None
        }
        result["per_run_s"] = round(result["wall_s"] / len(records), 1)
        result["generate_landing_s"] = round(generate_s, 1)
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=15)
    parser.add_argument("--rows", type=int, default=200, help="trips per day")
    parser.add_argument("--mode", choices=["per-partition", "chunked"], default=None)
    parser.add_argument("--assets", default="raw_trips", help="an asset key, or 'group'")
    parser.add_argument(
        "--executor", choices=["multiprocess", "in_process"], default="multiprocess"
    )
    parser.add_argument("--granularity", choices=["run", "op"], default="run")
    parser.add_argument("--op-run-buffer", type=int, default=None)
    parser.add_argument("--tick", type=float, default=1.0, help="backfill daemon interval, s")
    parser.add_argument("--timeout", type=float, default=3600.0)
    args = parser.parse_args()
    modes = [args.mode] if args.mode else ["per-partition", "chunked"]
    for mode in modes:
        args.mode = mode
        case = {k: v for k, v in vars(args).items() if k != "timeout"}
        print(json.dumps({**case, **run_case(args)}), flush=True)


if __name__ == "__main__":
    main()
