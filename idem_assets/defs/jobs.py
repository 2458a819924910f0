"""Jobs: the whole daily chain for one day, used by the schedule and the late-file sensor."""

import dagster as dg

from idem_assets.defs.partitions import GROUP

taxi_daily_job = dg.define_asset_job(
    name="taxi_daily",
    selection=dg.AssetSelection.groups(GROUP),
    description="Load, merge and aggregate one day of taxi trips, and extend the running total.",
)
