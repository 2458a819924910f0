"""The daily schedule: the latest complete day only (catch-up off, as in Airflow 3)."""

from datetime import UTC, date, datetime, timedelta

import dagster as dg

from idem_assets.defs.jobs import taxi_daily_job
from idem_assets.defs.partitions import FIRST_DAY
from idem_assets.defs.resources import LandingZone
from idem_assets.landing import csv_path, landing_fingerprint


def day_that_just_ended(tick: datetime) -> str | None:
    """The last partition that ended before the tick, None before the first one."""
    day = (tick.astimezone(UTC).date() - timedelta(days=1)).isoformat()
    return day if day >= FIRST_DAY else None


# Missed days are never run automatically: filling a gap is a backfill someone launches on purpose.
@dg.schedule(
    job=taxi_daily_job,
    cron_schedule="0 1 * * *",
    execution_timezone="UTC",
    name="taxi_daily_schedule",
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description=(
        "At 01:00 UTC, runs taxi_daily for the day that just ended, once (its run key is the"
        " day). Catch-up is off: days missed while the schedule was stopped are not run, fill"
        " them with a backfill. A day whose landing file has not arrived is skipped, not failed:"
        " late_file_sensor loads it when the file lands."
    ),
)
def taxi_daily_schedule(
    context: dg.ScheduleEvaluationContext, landing: LandingZone
) -> dg.RunRequest | dg.SkipReason:
    """Request the day that just ended, if its landing file is there."""
    day = day_that_just_ended(context.scheduled_execution_time)
    if day is None:
        return dg.SkipReason("The daily partitions have not started yet.")
    if landing_fingerprint(landing.path, date.fromisoformat(day)) is None:
        return dg.SkipReason(
            f"No landing file for {day} yet: {csv_path(landing.path, date.fromisoformat(day))}"
            " does not exist. late_file_sensor loads the day when it arrives; or backfill it."
        )
    return dg.RunRequest(run_key=day, partition_key=day)
