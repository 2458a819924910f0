"""Where a backfill's wall time goes, phase by phase, through the stock dagster-daemon.

Each case starts the stock dagster-daemon (30 s backfill tick) and dagster-webserver on a private
DAGSTER_HOME with the repository's dagster.yaml, writes landing files with
``python -m idem_assets.landing generate``, launches work as the UI does and splits the time from
the launch to the end of the last run into phases read from the runs' event logs:

    python benchmarks/backfill_phases.py          # one day, 31 days, a year (or every day so far)
    python benchmarks/backfill_phases.py --cases day,month --repeat 3 --save after.json
    python benchmarks/backfill_phases.py --compare before.json after.json

Every instant of the wall time is given to one phase, the most advanced one any run is in, so
the phases add up to the wall time. The load average is recorded with each case, since the
machine may be shared; CPU seconds are those of the daemon, webserver and run workers.
"""

import argparse
import itertools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
# tests/e2e/dagster_services.py imports its sibling tests/ports.py as pytest runs it.
sys.path.append(str(REPO_ROOT / "tests"))

from idem_assets.defs.partitions import DAILY  # noqa: E402
from tests.e2e.dagster_services import (  # noqa: E402
    TERMINAL_RUN_STATUSES,
    DagsterGraphQLClient,
    DagsterServices,
    GraphQLError,
    RunRecord,
)

GROUP = ["raw_trips", "trips", "daily_zone_revenue", "revenue_running_total"]
CASES = {"day": 1, "month": 31, "year": 365}

#: Phases in the order a run goes through them; at each instant the latest one any run is in wins.
PHASES = (
    ("tick", "before a run is queued: backfill tick, or the launch"),
    ("queued", "queued: dequeue poll, waiting for the pool slot"),
    ("launch", "dequeued to launched (run launcher)"),
    ("worker", "run worker: process start, code load"),
    ("step_gap", "in a run, between steps (per-step process, code load)"),
    ("steps", "steps: data work, IO managers, checks"),
    ("teardown", "last step to run end (event writes)"),
)

_LAUNCH_RUN = """
mutation Launch($params: ExecutionParams!) {
  launchPipelineExecution(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on Error { message }
  }
}
"""

_EVENTS = """
query Events($runId: ID!, $cursor: String) {
  logsForRun(runId: $runId, afterCursor: $cursor) {
    __typename
    ... on EventConnection {
      cursor
      hasMore
      events { __typename ... on MessageEvent { timestamp stepKey eventType } }
    }
  }
}
"""

_RUN = """
query Run($runId: ID!) {
  runOrError(runId: $runId) {
    __typename
    ... on Run { runId status creationTime startTime endTime tags { key value } }
  }
}
"""


@dataclass(frozen=True)
class RunTimeline:
    """One run's milestones, epoch seconds, read from its event log."""

    enqueued: float
    dequeued: float
    starting: float
    started: float
    steps: list[tuple[float, float]]
    ended: float
    events: int


def timeline(client: DagsterGraphQLClient, run_id: str) -> RunTimeline:
    """Read a run's milestones from its whole event log."""
    cursor: str | None = None
    marks: dict[str, float] = {}
    opened: dict[str, float] = {}
    steps: list[tuple[float, float]] = []
    count = 0
    while True:
        payload = client.execute(_EVENTS, {"runId": run_id, "cursor": cursor})["logsForRun"]
        for event in payload["events"]:
            kind = event.get("eventType")
            if kind is None:
                continue
            count += 1
            at = float(event["timestamp"]) / 1000
            if kind == "STEP_START":
                opened[event["stepKey"]] = at
            elif kind in ("STEP_SUCCESS", "STEP_FAILURE") and event["stepKey"] in opened:
                steps.append((opened.pop(event["stepKey"]), at))
            elif kind in ("RUN_SUCCESS", "RUN_FAILURE", "RUN_CANCELED"):
                marks["ended"] = at
            else:
                marks.setdefault(kind, at)
        cursor = payload["cursor"]
        if not payload["hasMore"]:
            break
    enqueued = marks["RUN_ENQUEUED"]
    dequeued = marks.get("RUN_DEQUEUED", enqueued)
    starting = marks.get("RUN_STARTING", dequeued)
    return RunTimeline(
        enqueued=enqueued,
        dequeued=dequeued,
        starting=starting,
        started=marks.get("RUN_START", starting),
        steps=sorted(steps),
        ended=marks["ended"],
        events=count,
    )


def phase_at(runs: Sequence[RunTimeline], t: float) -> str:
    """The most advanced phase any run is in at instant ``t``."""
    best = 0
    names = [name for name, _ in PHASES]
    for run in runs:
        if not run.enqueued <= t < run.ended:
            continue
        if any(start <= t < end for start, end in run.steps):
            phase = "steps"
        elif run.steps and t >= run.steps[-1][1]:
            phase = "teardown"
        elif t >= run.started:
            phase = "step_gap"
        elif t >= run.starting:
            phase = "worker"
        elif t >= run.dequeued:
            phase = "launch"
        else:
            phase = "queued"
        best = max(best, names.index(phase))
    return names[best]


def split_phases(runs: Sequence[RunTimeline], launched_at: float) -> dict[str, float]:
    """Seconds of the wall time (launch to the last run's end) spent in each phase."""
    cuts = {launched_at, max(r.ended for r in runs)}
    for run in runs:
        cuts.update((run.enqueued, run.dequeued, run.starting, run.started, run.ended))
        cuts.update(t for step in run.steps for t in step)
    ordered = sorted(t for t in cuts if t >= launched_at)
    seconds = dict.fromkeys((name for name, _ in PHASES), 0.0)
    for start, end in itertools.pairwise(ordered):
        seconds[phase_at(runs, (start + end) / 2)] += end - start
    return seconds


def launch_one_day(services: DagsterServices, day: str) -> list[str]:
    """Materialize the whole group for one day as the UI's Materialize button does."""
    params = {
        "selector": {
            "repositoryLocationName": services.location_name,
            "repositoryName": "__repository__",
            "pipelineName": "__ASSET_JOB",
            "assetSelection": [{"path": [key]} for key in GROUP],
        },
        "mode": "default",
        "executionMetadata": {"tags": [{"key": "dagster/partition", "value": day}]},
    }
    payload = services.client.execute(_LAUNCH_RUN, {"params": params})["launchPipelineExecution"]
    if payload["__typename"] != "LaunchRunSuccess":
        raise GraphQLError(f"launchPipelineExecution failed: {payload}")
    return [payload["run"]["runId"]]


def wait_for_run(client: DagsterGraphQLClient, run_id: str, timeout_s: float) -> RunRecord:
    """Wait until a run has finished and return it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = client.execute(_RUN, {"runId": run_id})["runOrError"]
        if run["status"] in TERMINAL_RUN_STATUSES:
            tags = {tag["key"]: tag["value"] for tag in run["tags"]}
            return RunRecord(
                run_id,
                run["status"],
                tags,
                run["creationTime"],
                run["startTime"],
                run["endTime"],
            )
        time.sleep(0.2)
    raise TimeoutError(f"run {run_id} not finished after {timeout_s:.0f}s")


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages, as `uptime` prints them."""
    return [round(x, 2) for x in os.getloadavg()]


def one_case(services: DagsterServices, days: list[str], timeout_s: float) -> dict[str, Any]:
    """Launch one case, wait for it, and split its wall time into phases."""
    client = services.client
    load_before = load_average()
    launched_at = time.time()
    if len(days) == 1:
        records = [
            wait_for_run(client, run_id, timeout_s) for run_id in launch_one_day(services, days[0])
        ]
    else:
        backfill_id = client.launch_partition_backfill(GROUP, days, location=services.location_name)
        client.wait_for_backfill(backfill_id, timeout_s=timeout_s, poll_interval_s=0.2)
        records = client.runs_for_backfill(backfill_id)
    runs = [timeline(client, r.run_id) for r in records]
    ended = max(r.ended for r in runs)
    return {
        "days": len(days),
        "runs": len(records),
        "statuses": sorted({r.status for r in records}),
        "wall_s": round(ended - launched_at, 2),
        "run_start_to_success_s": [
            round(r.end_time - r.start_time, 2)
            for r in records
            if r.start_time is not None and r.end_time is not None
        ],
        "events": sum(r.events for r in runs),
        "phases_s": {k: round(v, 2) for k, v in split_phases(runs, launched_at).items()},
        "load_before": load_before,
        "load_after": load_average(),
    }


def children_cpu_s() -> float:
    """CPU seconds of finished descendants: services and the run workers they reaped."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_case(name: str, repeat: int, rows: int, timeout_s: float) -> list[dict[str, Any]]:
    """Start fresh services for each repeat of one case and measure it."""
    # The partitions end yesterday, so "a year" is every day so far when the year is young.
    days = list(DAILY.get_partition_keys()[: CASES[name]])
    samples = []
    for _ in range(repeat):
        work = Path(tempfile.mkdtemp(prefix="backfill-phases-"))
        try:
            landing_dir = work / "landing"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "idem_assets.landing",
                    "generate",
                    "--root",
                    str(landing_dir),
                    "--start",
                    days[0],
                    "--end",
                    days[-1],
                    "--rows",
                    str(rows),
                ],
                check=True,
                cwd=REPO_ROOT,
                stdout=subprocess.DEVNULL,
            )
            services = DagsterServices(
                dagster_home=work / "dagster_home",
                dagster_yaml=(REPO_ROOT / "dagster.yaml").read_text(),
                workspace=REPO_ROOT / "workspace.yaml",
                env={
                    "IDEM_LANDING_DIR": str(landing_dir),
                    "IDEM_DUCKDB_PATH": str(work / "warehouse.duckdb"),
                },
            )
            cpu_before = children_cpu_s()
            with services:
                sample = one_case(services, days, timeout_s)
            sample["services_cpu_s"] = round(children_cpu_s() - cpu_before, 1)
            sample["case"] = name
            print(json.dumps(sample), flush=True)
            samples.append(sample)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return samples


def medians(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Median wall time and phases of one case's samples."""
    return {
        "n": len(samples),
        "runs": samples[0]["runs"],
        "wall_s": statistics.median(s["wall_s"] for s in samples),
        "run_s": statistics.median(max(s["run_start_to_success_s"]) for s in samples),
        "cpu_s": statistics.median(s["services_cpu_s"] for s in samples),
        "load": max(s["load_before"][0] for s in samples),
        "phases_s": {
            name: statistics.median(s["phases_s"][name] for s in samples) for name, _ in PHASES
        },
    }


def table(title: str, results: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """A markdown table: one column per case, one row per phase, medians."""
    cases = [c for c in CASES if results.get(c)]
    summary = {c: medians(results[c]) for c in cases}
    head = [f"**{title}**", *(f"{c} ({results[c][0]['days']} days)" for c in cases)]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * len(cases) + "|"]

    def row(label: str, values: Sequence[str]) -> None:
        lines.append("| " + " | ".join([label, *values]) + " |")

    for name, label in PHASES:
        row(label, [f"{summary[c]['phases_s'][name]:.1f}" for c in cases])
    row("**launch to end of last run, s**", [f"**{summary[c]['wall_s']:.1f}**" for c in cases])
    row("longest run, start to end, s", [f"{summary[c]['run_s']:.1f}" for c in cases])
    row("runs", [str(summary[c]["runs"]) for c in cases])
    row("CPU s (daemon, webserver, runs)", [f"{summary[c]['cpu_s']:.0f}" for c in cases])
    row("samples; highest 1-min load", [f"{summary[c]['n']}; {summary[c]['load']}" for c in cases])
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cases", default="day,month,year", help="of: " + ",".join(CASES))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rows", type=int, default=1000, help="trips per day")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--save", type=Path, default=None, help="write the samples as JSON")
    parser.add_argument("--title", default="this tree")
    parser.add_argument(
        "--compare", nargs="+", type=Path, default=None, help="print saved results, no runs"
    )
    args = parser.parse_args()
    if args.compare:
        for path in args.compare:
            print(table(path.stem, json.loads(path.read_text())) + "\n")
        return
    results = {c: run_case(c, args.repeat, args.rows, args.timeout) for c in args.cases.split(",")}
    if args.save:
        args.save.write_text(json.dumps(results, indent=1))
    print(table(args.title, results))


if __name__ == "__main__":
    main()
