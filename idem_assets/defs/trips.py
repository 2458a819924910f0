"""trips: one row per trip, merged on trip_id so a corrected file updates and removes trips."""

import dagster as dg
import pyarrow as pa

import idem_assets as ia
from idem_assets.defs.partitions import CHUNKED, DAILY, GROUP, WAREHOUSE_ENGINE, WAREHOUSE_POOL


@ia.audited_asset(
    partitions_def=DAILY,
    backfill_policy=CHUNKED,
    io_manager_key="merge_io_manager",
    metadata={
        "partition_expr": "pickup_at",
        "primary_key": ["trip_id"],
        # A re-sent record carries a later updated_at: the latest version of a trip wins.
        "dedupe_order_by": ["updated_at"],
    },
    checks=[
        ia.unique("trip_id"),
        ia.between("fare", 0, 1000),
        ia.between("tip", 0, 1000),
    ],
    group_name=GROUP,
    kinds={WAREHOUSE_ENGINE},
    pool=WAREHOUSE_POOL,
)
def trips(context: dg.AssetExecutionContext, raw_trips: pa.Table) -> pa.Table:
    """Taxi trips, one row per trip_id, latest version wins; removed trips leave their day."""
    return raw_trips
