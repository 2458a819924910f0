"""raw_trips: each day's landing file, audited before it replaces that day in the warehouse."""

from datetime import date, timedelta

import dagster as dg
import pyarrow as pa

import idem_assets as ia
from idem_assets.defs.partitions import (
    CHUNKED,
    DAILY,
    FRESHNESS_HOURS,
    GROUP,
    WAREHOUSE_ENGINE,
    WAREHOUSE_POOL,
)
from idem_assets.defs.resources import LandingZone
from idem_assets.landing import read_day

RAW_TRIPS_CHECKS = [
    # The expected count comes from each day's manifest, handed over with the batch.
    ia.row_count(),
    ia.not_null("trip_id", "pickup_at"),
    # Re-sent records share a trip_id; `trips` keeps the latest, so here it only warns.
    ia.unique("trip_id", blocking=False),
    ia.between("passenger_count", 1, 6),
    ia.freshness("pickup_at", timedelta(hours=FRESHNESS_HOURS)),
]


@ia.audited_asset(
    partitions_def=DAILY,
    backfill_policy=CHUNKED,
    io_manager_key="overwrite_io_manager",
    metadata={"partition_expr": "pickup_at"},
    checks=RAW_TRIPS_CHECKS,
    group_name=GROUP,
    kinds={WAREHOUSE_ENGINE},
    pool=WAREHOUSE_POOL,
)
def raw_trips(context: dg.AssetExecutionContext, landing: LandingZone) -> ia.Batch:
    """Taxi trips exactly as the day's landing file delivered them."""
    tables, expected = [], {}
    for key in context.partition_keys:
        delivered = read_day(landing.path, date.fromisoformat(key))
        tables.append(delivered.table)
        expected[key] = delivered.expected_rows
        context.log.info(
            f"{key}: {delivered.table.num_rows} rows, manifest says {delivered.expected_rows}"
            f" (version {delivered.version}, sha256 {delivered.sha256[:12]})"
        )
    return ia.Batch(pa.concat_tables(tables), expected_rows=expected)
