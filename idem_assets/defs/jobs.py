"""Jobs: the whole daily chain for one day, used by the schedule and the late-file sensor."""

import dagster as dg

from idem_assets.defs.partitions import GROUP, WAREHOUSE_POOL_REASON

#: One process per run: the warehouse pool already keeps runs apart, so steps in processes of
#: their own would only add 3-8 s of start-up each on a small machine. A launch may override it.
IN_PROCESS = {"execution": {"config": {"in_process": {}}}}

taxi_daily_job = dg.define_asset_job(
    name="taxi_daily",
    selection=dg.AssetSelection.groups(GROUP),
    config=IN_PROCESS,
    description=(
        "Load, merge and aggregate one day of taxi trips, and extend the running total; the"
        " daily schedule, the late-file sensor and job backfills run it. Its steps run one after"
        f" another in one process. {WAREHOUSE_POOL_REASON}"
    ),
)
