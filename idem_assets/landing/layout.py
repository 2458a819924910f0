"""Where a day's landing files live and what their columns are."""

import os
from datetime import date
from pathlib import Path

import pyarrow as pa

LANDING_DIR_ENV = "IDEM_LANDING_DIR"


TRIPS_DIR = "trips"


TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S"


COLUMNS: tuple[str, ...] = (
    "trip_id",
    "pickup_at",
    "dropoff_at",
    "passenger_count",
    "fare",
    "tip",
    "pickup_zone",
    "dropoff_zone",
    "updated_at",
)


SCHEMA = pa.schema(
    [
        ("trip_id", pa.string()),
        ("pickup_at", pa.timestamp("us")),
        ("dropoff_at", pa.timestamp("us")),
        ("passenger_count", pa.int64()),
        ("fare", pa.float64()),
        ("tip", pa.float64()),
        ("pickup_zone", pa.string()),
        ("dropoff_zone", pa.string()),
        ("updated_at", pa.timestamp("us")),
    ]
)


def default_landing_dir() -> Path:
    """Return ``$IDEM_LANDING_DIR`` if set, else ``<repo root>/.data/landing``."""
    configured = os.environ.get(LANDING_DIR_ENV)
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[2] / ".data" / "landing"


def csv_path(root: Path, day: date) -> Path:
    """Return the path of the day's CSV."""
    return Path(root) / TRIPS_DIR / f"{day:%Y-%m-%d}.csv"


def manifest_path(root: Path, day: date) -> Path:
    """Return the path of the day's manifest."""
    return Path(root) / TRIPS_DIR / f"{day:%Y-%m-%d}.manifest.json"


def _generate_command(root: Path, day: date) -> str:
    return (
        f"`python -m idem_assets.landing generate --root {root} --start {day:%Y-%m-%d}"
        f" --end {day:%Y-%m-%d}`"
    )
