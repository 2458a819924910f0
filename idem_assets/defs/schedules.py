"""The daily schedule: the latest complete day only (catch-up off, as in Airflow 3)."""

import dagster as dg

from idem_assets.defs.jobs import taxi_daily_job

# A partitioned schedule asks for the partition that just ended. Missed days are never run
# automatically: filling a gap is a backfill someone launches on purpose.
taxi_daily_schedule = dg.build_schedule_from_partitioned_job(
    taxi_daily_job,
    hour_of_day=1,
    name="taxi_daily_schedule",
    default_status=dg.DefaultScheduleStatus.STOPPED,
)
