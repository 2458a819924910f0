"""The idem_assets code location: everything under ``defs/`` is loaded from there."""

import warnings
from pathlib import Path

import dagster as dg

# revenue_running_total runs a whole range in one run while the other assets run in chunks of 31
# days. The mix is deliberate: an asset backfill uses each asset's own policy, and taxi_daily is
# launched one day at a time, so Dagster's notice about the job's mixed policies says nothing
# useful. (The filter sits here because Dagster loads defs/ inside catch_warnings.)
warnings.filterwarnings(
    "ignore", message="Asset job taxi_daily materializes assets with varying BackfillPolicies"
)


@dg.definitions
def defs() -> dg.Definitions:
    """Load the taxi-trips code location from the defs folder."""
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
