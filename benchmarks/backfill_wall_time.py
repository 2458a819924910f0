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
from datetime import date
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
# tests/e2e/dagster_services.py imports its sibling tests/ports.py as pytest runs it.
sys.path.append(str(REPO_ROOT / "tests"))

from idem_assets import landing  # noqa: E402
from idem_assets.defs.partitions import DAILY, WAREHOUSE_POOL  # noqa: E402
from tests.e2e.dagster_services import DagsterServices  # noqa: E402
from tests.e2e.test_backfills import (  # noqa: E402
    GROUP,
    IN_PROCESS,
    launch_one_run_per_partition,
    run_events,
    summary,
)

MODULE = "idem_assets.definitions"

MULTIPROCESS: dict[str, Any] = {"execution": {"config": {"multiprocess": {}}}}


def instance_yaml(granularity: str, op_run_buffer: int | None) -> str:
    """The repository's dagster.yaml with the pool granularity under test and a 1 s queue poll."""
    config = yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())
    pools = config["concurrency"]["pools"]
    pools["granularity"] = granularity
    if op_run_buffer is not None:
        pools["op_granularity_run_buffer"] = op_run_buffer
    config["run_queue"] = {"dequeue_interval_seconds": 1}
    return yaml.safe_dump(config, sort_keys=False)


def then_running_total(services: DagsterServices, partitions: list[str]) -> dict[str, Any]:
    """Recompute revenue_running_total over the whole range with an asset backfill."""
    launched_at = time.time()
    backfill_id = services.client.launch_partition_backfill(
        ["revenue_running_total"], partitions, location=services.location_name
    )
    services.client.wait_for_backfill(backfill_id, timeout_s=1800)
    records = services.client.runs_for_backfill(backfill_id)
    assert {r.status for r in records} == {"SUCCESS"}
    ends = [r.end_time for r in records if r.end_time is not None]
    return {
        "running_total_backfill_wall_s": round(max(ends) - launched_at, 1),
        "running_total_runs": len(records),
    }


def run_case(args: argparse.Namespace) -> dict[str, Any]:
    """Start the services, run one backfill, return its measurements."""
    work = Path(tempfile.mkdtemp(prefix="backfill-bench-"))
    # DAILY starts 2026-01-01 and ends yesterday, so "365 days" may be fewer; the output says.
    partitions = DAILY.get_partition_keys()[: args.days]
    first_day, last_day = date.fromisoformat(partitions[0]), date.fromisoformat(partitions[-1])
    assets = GROUP if args.assets == "group" else [args.assets]
    try:
        started = time.monotonic()
        landing.generate(work / "landing", first_day, last_day, args.rows)
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
                records = services.wait_for_backfill_runs(
                    backfill_id, len(partitions), timeout_s=args.timeout
                )
            else:
                backfill_id = services.client.launch_partition_backfill(
                    assets, partitions, location=services.location_name
                )
                services.client.wait_for_backfill(backfill_id, timeout_s=args.timeout)
                records = services.client.runs_for_backfill(backfill_id)
            events = {r.run_id: run_events(services.client, r.run_id) for r in records}
            then = then_running_total(services, partitions) if args.then_running_total else {}
        result = {"partitions": len(partitions), **summary(records, events, launched_at), **then}
        result["statuses"] = sorted({r.status for r in records})
        # Start to end of each run, in launch order (two runs may share a range).
        result["run_s"] = [
            [r.partition, round(r.end_time - r.start_time, 1)]
            for r in records
            if r.start_time is not None and r.end_time is not None
        ]
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
    parser.add_argument(
        "--then-running-total",
        action="store_true",
        help="then recompute revenue_running_total over the range (an asset backfill), timed",
    )
    parser.add_argument("--timeout", type=float, default=3600.0)
    args = parser.parse_args()
    modes = [args.mode] if args.mode else ["per-partition", "chunked"]
    for mode in modes:
        args.mode = mode
        case = {k: v for k, v in vars(args).items() if k != "timeout"}
        print(json.dumps({**case, **run_case(args)}), flush=True)


if __name__ == "__main__":
    main()
