"""The daily schedule: the latest complete day only (catch-up off, as in Airflow 3)."""

import dagster as dg

from idem_assets.defs.jobs import taxi_daily_job
from idem_assets.defs.partitions import DAILY

# A partitioned schedule asks for the partition that just ended. Missed days are never run
# automatically: filling a gap is a backfill someone launches on purpose.
taxi_daily_schedule = dg.build_schedule_from_partitioned_job(
    taxi_daily_job,
    hour_of_day=1,
    name="taxi_daily_schedule",
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description=(
        "At 01:00 UTC, runs taxi_daily for the day that just ended, once (its run key is the"
        " day). Catch-up is off: days missed while the schedule was stopped are not run, fill"
        " them with a backfill. The bundled data ends"
        f" {DAILY.get_last_partition_key()}, so here every tick asks for that last day and runs"
        " it once; a live feed drops the partitions' end_date."
    ),
)
