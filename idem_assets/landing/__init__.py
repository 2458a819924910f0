"""Deterministic landing zone: one CSV of synthetic NYC-style taxi trips per day, plus a manifest.

Layout under a root directory::

    <root>/trips/2026-01-05.csv            the trips whose pickup falls on that day
    <root>/trips/2026-01-05.manifest.json  {"date", "rows", "sha256", "version"}

Every file is derived from its day (and, for a mess, from the bytes it rewrites), never from the
wall clock, so running the same command twice writes byte-identical files. The "messes" reproduce
what makes reruns dangerous in real feeds: corrections, re-sent records, stray rows, bad values,
late or short deliveries.

Command line::

    python -m idem_assets.landing generate --start 2026-01-01 --end 2026-01-31 --rows 1000
    python -m idem_assets.landing generate --start 2026-01-01 --end today --missing-only
    python -m idem_assets.landing mess --day 2026-01-05 --correct --changed 10 --removed 5
    python -m idem_assets.landing show
"""

from idem_assets.landing.cli import (
    main,
)
from idem_assets.landing.generator import (
    CORRECTION_DELAY,
    LATEST_PICKUP_WITHIN,
    MAX_FARE_CENTS,
    MAX_PASSENGERS,
    MAX_ROWS,
    MAX_TIP_PERCENT,
    MAX_TRIP,
    MIN_FARE_CENTS,
    MIN_PASSENGERS,
    MIN_TRIP,
    STRAY_TRIP_BASE,
    UPDATE_DELAY,
    ZONES,
    _csv_bytes,
    _original_trips,
    add_bad_passengers,
    add_duplicates,
    add_stray_row,
    correct,
    generate,
    make_stale,
    short_manifest,
)
from idem_assets.landing.layout import (
    COLUMNS,
    LANDING_DIR_ENV,
    SCHEMA,
    TIMESTAMP_FORMAT,
    TRIPS_DIR,
    csv_path,
    default_landing_dir,
    manifest_path,
)
from idem_assets.landing.reader import (
    CorruptLandingFileError,
    LandingFile,
    LandingFileError,
    ManifestMismatchError,
    MissingLandingFileError,
    landing_fingerprint,
    list_days,
    manifest_rows,
    read_day,
)

__all__ = [
    "COLUMNS",
    "CORRECTION_DELAY",
    "LANDING_DIR_ENV",
    "LATEST_PICKUP_WITHIN",
    "MAX_FARE_CENTS",
    "MAX_PASSENGERS",
    "MAX_ROWS",
    "MAX_TIP_PERCENT",
    "MAX_TRIP",
    "MIN_FARE_CENTS",
    "MIN_PASSENGERS",
    "MIN_TRIP",
    "SCHEMA",
    "STRAY_TRIP_BASE",
    "TIMESTAMP_FORMAT",
    "TRIPS_DIR",
    "UPDATE_DELAY",
    "ZONES",
    "CorruptLandingFileError",
    "LandingFile",
    "LandingFileError",
    "ManifestMismatchError",
    "MissingLandingFileError",
    "_csv_bytes",
    "_original_trips",
    "add_bad_passengers",
    "add_duplicates",
    "add_stray_row",
    "correct",
    "csv_path",
    "default_landing_dir",
    "generate",
    "landing_fingerprint",
    "list_days",
    "main",
    "make_stale",
    "manifest_path",
    "manifest_rows",
    "read_day",
    "short_manifest",
]
