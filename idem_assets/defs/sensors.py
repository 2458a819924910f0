"""The late-file sensor: a new or corrected landing file for a past day reruns that day."""

import json
from datetime import date

import dagster as dg

from idem_assets.defs.jobs import taxi_daily_job
from idem_assets.defs.partitions import DAILY
from idem_assets.defs.resources import LandingZone
from idem_assets.landing import landing_fingerprint, list_days

RUNNING_TOTAL = dg.AssetKey("revenue_running_total")


def run_key_for(day: date, sha256: str) -> str:
    """The run key of one version of a day's file: the same bytes never trigger twice."""
    return f"{day.isoformat()}:{sha256[:16]}"


def late_file_requests(
    seen: dict[str, str],
    fingerprints: dict[str, str],
    last_partition: str | None,
    last_total: str | None,
) -> list[dg.RunRequest]:
    """Run requests for days whose file is new or changed since ``seen``; updates ``seen``.

    A changed day also changes every later running total, so when totals exist past that day
    one more run recomputes them from that day on, in a single pass.
    """
    requests = []
    for key, sha in sorted(fingerprints.items()):
        # The day still in progress is the schedule's; only finished days can be late.
        if last_partition is None or key > last_partition or seen.get(key) == sha:
            continue
        seen[key] = sha
        run_key = run_key_for(date.fromisoformat(key), sha)
        requests.append(
            dg.RunRequest(
                run_key=run_key,
                partition_key=key,
                tags={"idem_assets/landing_sha256": sha},
            )
        )
        if last_total is not None and last_total > key:
            next_day = DAILY.get_next_partition_key(key)
            assert next_day is not None
            requests.append(
                dg.RunRequest(
                    run_key=f"{run_key}:running_total",
                    asset_selection=[RUNNING_TOTAL],
                    tags={
                        "dagster/asset_partition_range_start": next_day,
                        "dagster/asset_partition_range_end": last_total,
                    },
                )
            )
    return requests


@dg.sensor(
    job=taxi_daily_job,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.STOPPED,
    description="Reruns a past day when its landing file appears late or is corrected.",
)
def late_file_sensor(context: dg.SensorEvaluationContext, landing: LandingZone) -> dg.SensorResult:
    """Request a rerun of every finished day whose landing file is new or changed."""
    seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    fingerprints = {}
    for day in list_days(landing.path):
        if DAILY.has_partition_key(day.isoformat()):
            sha = landing_fingerprint(landing.path, day)
            if sha is not None:
                fingerprints[day.isoformat()] = sha
    totals = context.instance.get_materialized_partitions(RUNNING_TOTAL)
    requests = late_file_requests(
        seen, fingerprints, DAILY.get_last_partition_key(), max(totals) if totals else None
    )
    return dg.SensorResult(run_requests=requests, cursor=json.dumps(seen, sort_keys=True))
