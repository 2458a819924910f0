"""The idem_assets code location: everything under ``defs/`` is loaded from there."""

from pathlib import Path

import dagster as dg


@dg.definitions
def defs() -> dg.Definitions:
    """Load the taxi-trips code location from the defs folder."""
    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
