"""A tiny code location the end-to-end harness uses to test itself."""

import time

import dagster as dg

toy_partitions = dg.DailyPartitionsDefinition(start_date="2026-01-01")


@dg.asset(partitions_def=toy_partitions, backfill_policy=dg.BackfillPolicy.multi_run(1))
def toy_daily() -> dg.MaterializeResult:
    """Sleeps a second so that concurrent runs overlap long enough to be measured."""
    time.sleep(1)
    return dg.MaterializeResult()


toy_job = dg.define_asset_job("toy_job", selection=[toy_daily], partitions_def=toy_partitions)

defs = dg.Definitions(assets=[toy_daily], jobs=[toy_job])
