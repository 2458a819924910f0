"""The late-file sensor: a new or corrected landing file for a past day reruns that day."""

import hashlib
import json
from datetime import date
from typing import Any

import dagster as dg

from idem_assets.defs.jobs import taxi_daily_job
from idem_assets.defs.partitions import DAILY, FIRST_DAY
from idem_assets.defs.resources import LandingZone
from idem_assets.landing import landing_fingerprint, list_days

RUNNING_TOTAL = dg.AssetKey("revenue_running_total")


def run_key_for(day: date, sha256: str, seen_versions: int = 1) -> str:
    """The run key of one version of a day's file: the same bytes never trigger twice.

    ``seen_versions`` counts the versions of the day seen so far, so a file that returns to
    bytes it had before (a withdrawn correction) is still loaded again.
    """
    return f"{day.isoformat()}:{sha256[:16]}:{seen_versions}"


def late_file_requests(
    seen: dict[str, dict[str, Any]],
    fingerprints: dict[str, str],
    last_partition: str | None,
    last_total: str | None,
) -> list[dg.RunRequest]:
    """Run requests for days whose file is new or changed since ``seen``; updates ``seen``.

    A changed day also changes every later running total, so when totals exist past the
    earliest changed day, one last run recomputes them from there on, in a single pass.
    """
    requests = []
    for key, sha in sorted(fingerprints.items()):
        # The day still in progress is the schedule's; only finished days can be late.
        if last_partition is None or key > last_partition:
            continue
        state = seen.get(key, {"sha256": None, "versions": 0})
        if state["sha256"] == sha:
            continue
        versions = state["versions"] + 1
        seen[key] = {"sha256": sha, "versions": versions}
        requests.append(
            dg.RunRequest(
                run_key=run_key_for(date.fromisoformat(key), sha, versions),
                partition_key=key,
                tags={"idem_assets/landing_sha256": sha},
            )
        )
    earliest = requests[0].partition_key if requests else None
    if earliest is not None and last_total is not None and last_total > earliest:
        next_day = DAILY.get_next_partition_key(earliest)
        assert next_day is not None
        # Queued after the day runs (the warehouse pool runs one at a time, oldest first).
        digest = hashlib.sha256("|".join(r.run_key or "" for r in requests).encode()).hexdigest()
        requests.append(
            dg.RunRequest(
                run_key=f"running_total:{next_day}...{last_total}:{digest[:16]}",
                asset_selection=[RUNNING_TOTAL],
                tags={
                    "dagster/asset_partition_range_start": next_day,
                    "dagster/asset_partition_range_end": last_total,
                },
            )
        )
    return requests


def baseline(fingerprints: dict[str, str]) -> dict[str, dict[str, Any]]:
    """A cursor that counts every file present now as seen, so none of them is rerun."""
    return {key: {"sha256": sha, "versions": 1} for key, sha in fingerprints.items()}


@dg.sensor(
    job=taxi_daily_job,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description=(
        "Reruns a finished day when its landing file appears late or is corrected (a file's"
        " sha256 is its run key, so the same bytes never run twice), then recomputes the later"
        " running totals. Its first tick only records the files already there: loading those is"
        " a backfill's job, not one run per file."
    ),
)
def late_file_sensor(context: dg.SensorEvaluationContext, landing: LandingZone) -> dg.SensorResult:
    """Request a rerun of every finished day whose landing file is new or changed."""
    fingerprints = {}
    # Today's file too, when it is already there: the baseline then counts it as seen, so when
    # the day ends the schedule loads it, not the schedule and this sensor both.
    for day in list_days(landing.path):
        if day.isoformat() >= FIRST_DAY:
            sha = landing_fingerprint(landing.path, day)
            if sha is not None:
                fingerprints[day.isoformat()] = sha
    if not context.cursor:
        seen = baseline(fingerprints)
        return dg.SensorResult(
            skip_reason=(
                f"First tick: recorded {len(seen)} landing file(s) as the baseline; a file that"
                " appears or changes from now on reruns its day. Backfill the days already there."
            ),
            cursor=json.dumps(seen, sort_keys=True),
        )
    seen: dict[str, dict[str, Any]] = json.loads(context.cursor)
    totals = context.instance.get_materialized_partitions(RUNNING_TOTAL)
    requests = late_file_requests(
        seen, fingerprints, DAILY.get_last_partition_key(), max(totals) if totals else None
    )
    return dg.SensorResult(run_requests=requests, cursor=json.dumps(seen, sort_keys=True))
