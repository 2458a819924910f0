"""Jobs: the whole daily chain for one day, used by the schedule and the late-file sensor."""

import warnings

import dagster as dg

from idem_assets.defs.partitions import DAILY, GROUP

# revenue_running_total runs its whole range in one run while the other assets run in chunks of
# 31 days; the mix is deliberate, and this job is launched one day at a time, so Dagster's notice
# about a job whose assets differ in backfill policy says nothing useful here.
warnings.filterwarnings(
    "ignore", message="Asset job taxi_daily materializes assets with varying BackfillPolicies"
)

taxi_daily_job = dg.define_asset_job(
    name="taxi_daily",
    selection=dg.AssetSelection.groups(GROUP),
    partitions_def=DAILY,
    description="Load, merge and aggregate one day of taxi trips, and extend the running total.",
)
