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

import argparse
import csv
import hashlib
import io
import json
import os
import random
import re
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv

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

# Spaces, slashes and one comma, so the CSV writer and reader must quote properly.
ZONES: tuple[str, ...] = (
    "JFK Airport",
    "LaGuardia Airport",
    "Midtown Center",
    "Midtown East",
    "Times Sq/Theatre District",
    "Penn Station/Madison Sq West",
    "Upper East Side North",
    "Upper East Side South",
    "Upper West Side South",
    "Lincoln Square East",
    "Murray Hill",
    "Gramercy",
    "Union Sq",
    "East Village",
    "West Village",
    "Clinton East",
    "Financial District North",
    "Battery Park City",
    "Central Park",
    "Park Slope, Brooklyn",
)

# The latest pickup of a generated (unmessed) day lies within this window before midnight.
LATEST_PICKUP_WITHIN = timedelta(hours=1)
MIN_PASSENGERS, MAX_PASSENGERS = 1, 6
MIN_FARE_CENTS, MAX_FARE_CENTS = 250, 15_000
MAX_TIP_PERCENT = 30
MIN_TRIP, MAX_TRIP = timedelta(minutes=3), timedelta(minutes=90)
UPDATE_DELAY = timedelta(hours=2)
CORRECTION_DELAY = timedelta(days=1)
# Generated trip numbers stay below this so stray rows (numbered from it) never collide with them.
STRAY_TRIP_BASE = 900_000
MAX_ROWS = STRAY_TRIP_BASE - 1

_SECONDS_PER_DAY = 86_400
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_ARROW_COLUMN = re.compile(r"In CSV column #(\d+)")
_INT = re.compile(r"^[+-]?\d+$")


class LandingFileError(Exception):
    """A landing file could not be read or does not match its manifest."""


class MissingLandingFileError(LandingFileError):
    """The day's CSV does not exist."""


class CorruptLandingFileError(LandingFileError):
    """The day's CSV cannot be parsed: truncated, wrong header, or a value of the wrong type."""


class ManifestMismatchError(LandingFileError):
    """The day's manifest is missing or invalid, or its sha256 differs from the CSV's bytes."""


@dataclass(frozen=True)
class LandingFile:
    """One day's landing file, parsed with :data:`SCHEMA` and verified against its manifest."""

    day: date
    path: Path
    table: pa.Table
    expected_rows: int
    sha256: str
    version: int


@dataclass(frozen=True)
class _Manifest:
    day: date
    rows: int
    sha256: str
    version: int


@dataclass(frozen=True)
class _Trip:
    trip_id: str
    pickup_at: datetime
    dropoff_at: datetime
    passenger_count: int
    fare_cents: int
    tip_cents: int
    pickup_zone: str
    dropoff_zone: str
    updated_at: datetime

    def to_fields(self) -> list[str]:
        return [
            self.trip_id,
            self.pickup_at.strftime(TIMESTAMP_FORMAT),
            self.dropoff_at.strftime(TIMESTAMP_FORMAT),
            str(self.passenger_count),
            _format_cents(self.fare_cents),
            _format_cents(self.tip_cents),
            self.pickup_zone,
            self.dropoff_zone,
            self.updated_at.strftime(TIMESTAMP_FORMAT),
        ]

    @classmethod
    def from_fields(cls, fields: Sequence[str]) -> "_Trip":
        trip_id, pickup, dropoff, passengers, fare, tip, pickup_zone, dropoff_zone, updated = fields
        return cls(
            trip_id=trip_id,
            pickup_at=datetime.strptime(pickup, TIMESTAMP_FORMAT),
            dropoff_at=datetime.strptime(dropoff, TIMESTAMP_FORMAT),
            passenger_count=int(passengers),
            fare_cents=_parse_cents(fare),
            tip_cents=_parse_cents(tip),
            pickup_zone=pickup_zone,
            dropoff_zone=dropoff_zone,
            updated_at=datetime.strptime(updated, TIMESTAMP_FORMAT),
        )


def default_landing_dir() -> Path:
    """Return ``$IDEM_LANDING_DIR`` if set, else ``<repo root>/.data/landing``."""
    configured = os.environ.get(LANDING_DIR_ENV)
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parent.parent / ".data" / "landing"


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


def read_day(root: Path, day: date) -> LandingFile:
    """Read and verify one day's landing file.

    Refuses only files it cannot read or whose bytes disagree with their manifest; row counts and
    value ranges are left to the data-quality checks downstream.

    Raises:
        MissingLandingFileError: The CSV does not exist.
        ManifestMismatchError: The manifest is missing or invalid, or its sha256 differs.
        CorruptLandingFileError: The CSV is truncated, has the wrong header or a mistyped value.
    """
    landing, _ = _read(root, day)
    return landing


def landing_fingerprint(root: Path, day: date) -> str | None:
    """Return the sha256 of the day's CSV bytes, or None if the CSV does not exist.

    Hashes the file without parsing it, so a sensor can call it cheaply on every tick.
    """
    try:
        with csv_path(root, day).open("rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except FileNotFoundError:
        return None


def manifest_rows(root: Path, day: date) -> int:
    """Return the rows the day's manifest declares, reading the manifest only, never the CSV.

    Raises:
        ManifestMismatchError: The manifest is missing or invalid.
    """
    return _read_manifest(root, day).rows


def list_days(root: Path) -> list[date]:
    """Return the days that have a manifest under ``root``, sorted."""
    directory = Path(root) / TRIPS_DIR
    if not directory.is_dir():
        return []
    days = []
    for path in directory.glob("*.manifest.json"):
        name = path.name.removesuffix(".manifest.json")
        try:
            day = date.fromisoformat(name)
        except ValueError:
            continue
        # fromisoformat also accepts "20260105"; only the canonical spelling is a landing file.
        if name == day.isoformat():
            days.append(day)
    return sorted(days)


def _read(root: Path, day: date) -> tuple[LandingFile, bytes]:
    path = csv_path(root, day)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise MissingLandingFileError(
            f"No landing file for {day}: {path} does not exist. Generate it with"
            f" {_generate_command(root, day)}, or check that the root directory is right"
            f" (${LANDING_DIR_ENV} or --root)."
        ) from None
    manifest = _read_manifest(root, day)
    # Parse before comparing hashes: "truncated at line 512" says more than "sha256 differs".
    table = _parse_csv(root, day, path, data)
    actual = hashlib.sha256(data).hexdigest()
    if actual != manifest.sha256:
        raise ManifestMismatchError(
            f"Landing file for {day} at {path} does not match its manifest: the CSV's sha256 is"
            f" {actual} but {manifest_path(root, day)} says {manifest.sha256}. The file changed"
            " after its manifest was written; rewrite the manifest or restore the file (for a"
            f" generated day: {_generate_command(root, day)})."
        )
    landing = LandingFile(
        day=day,
        path=path,
        table=table,
        expected_rows=manifest.rows,
        sha256=manifest.sha256,
        version=manifest.version,
    )
    return landing, data


def _read_manifest(root: Path, day: date) -> _Manifest:
    path = manifest_path(root, day)
    fix = (
        "The writer may have stopped between the CSV and its manifest; regenerate the day with"
        f" {_generate_command(root, day)}, or write the manifest for the CSV that is there."
    )
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestMismatchError(
            f"Landing file for {day} has no manifest: {path} does not exist. {fix}"
        ) from None
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise ManifestMismatchError(
            f"Manifest for {day} at {path} is not valid JSON ({exc}). {fix}"
        ) from None
    problems = []
    if not isinstance(obj, dict):
        problems.append("it is not a JSON object")
        obj = {}
    if obj.get("date") != day.isoformat():
        problems.append(f"date is {obj.get('date')!r}, expected {day.isoformat()!r}")
    rows, sha, version = obj.get("rows"), obj.get("sha256"), obj.get("version")
    # bool is an int subclass; a manifest saying "rows": true is still wrong.
    if type(rows) is not int or rows < 0:
        problems.append(f"rows is {rows!r}, expected a non-negative integer")
    if not isinstance(sha, str) or not _SHA256_HEX.match(sha):
        problems.append(f"sha256 is {sha!r}, expected 64 lowercase hex digits")
    if type(version) is not int or version < 1:
        problems.append(f"version is {version!r}, expected an integer >= 1")
    if problems:
        raise ManifestMismatchError(
            f"Manifest for {day} at {path} is invalid: {'; '.join(problems)}. {fix}"
        )
    assert isinstance(rows, int) and isinstance(sha, str) and isinstance(version, int)
    return _Manifest(day=day, rows=rows, sha256=sha, version=version)


def _parse_csv(root: Path, day: date, path: Path, data: bytes) -> pa.Table:
    def corrupt(what: str) -> CorruptLandingFileError:
        return CorruptLandingFileError(
            f"Landing file for {day} at {path} cannot be read: {what}. Regenerate it with"
            f" {_generate_command(root, day)}, or restore it from the source."
        )

    if not data:
        raise corrupt("the file is empty (not even a header row)")
    header_line = data.split(b"\n", 1)[0].decode("utf-8", errors="replace")
    header = next(csv.reader([header_line]), [])
    if header != list(COLUMNS):
        raise corrupt(f"line 1 has header {header!r}, expected {list(COLUMNS)!r}")
    if not data.endswith(b"\n"):
        # A cut in the middle of a line can still parse (e.g. "14:03:2" is a valid time), so the
        # missing final line ending is the reliable sign of truncation.
        last_line = data.count(b"\n") + 1
        raise corrupt(f"the file is truncated: line {last_line} has no line ending")
    try:
        return pa_csv.read_csv(
            pa.BufferReader(data),
            read_options=pa_csv.ReadOptions(column_names=list(COLUMNS), skip_rows=1),
            parse_options=pa_csv.ParseOptions(newlines_in_values=False),
            convert_options=pa_csv.ConvertOptions(
                column_types=SCHEMA,
                include_columns=list(COLUMNS),
                timestamp_parsers=[TIMESTAMP_FORMAT],
                # Only an empty field is null, so "NA" in passenger_count is an error, not a null.
                null_values=[""],
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
    except pa.ArrowException as exc:
        detail = _ARROW_COLUMN.sub(
            lambda m: f"{m.group(0)} ({_column_name(int(m.group(1)))})", str(exc)
        )
        located = _locate_problem(data)
        raise corrupt(f"{located} ({detail})" if located else detail) from None


def _column_name(index: int) -> str:
    return COLUMNS[index] if 0 <= index < len(COLUMNS) else "?"


def _locate_problem(data: bytes) -> str | None:
    """Find the first bad line with the csv module, since pyarrow often omits the line number."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        return f"line {line} is not valid UTF-8"
    types = dict(zip(SCHEMA.names, SCHEMA.types, strict=True))
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        next(reader, None)
        for fields in reader:
            if not fields:
                continue
            if len(fields) != len(COLUMNS):
                return f"line {reader.line_num} has {len(fields)} fields, expected {len(COLUMNS)}"
            for name, value in zip(COLUMNS, fields, strict=True):
                if value and not _value_fits(types[name], value):
                    return f"line {reader.line_num}, column {name}: {value!r} is not {types[name]}"
    except csv.Error as exc:
        return f"line {reader.line_num}: {exc}"
    return None


def _value_fits(arrow_type: pa.DataType, value: str) -> bool:
    if pa.types.is_int64(arrow_type):
        return bool(_INT.match(value))
    if pa.types.is_float64(arrow_type):
        try:
            float(value)
        except ValueError:
            return False
        return True
    if pa.types.is_timestamp(arrow_type):
        try:
            datetime.strptime(value, TIMESTAMP_FORMAT)
        except ValueError:
            return False
        return True
    return True


def generate(
    root: Path, start: date, end: date, rows: int = 1000, *, missing_only: bool = False
) -> list[Path]:
    """Write one original (version 1) file per day from ``start`` to ``end`` inclusive.

    Each day's bytes depend only on the day and ``rows``; existing files are overwritten, or,
    with ``missing_only``, kept (a correction already delivered stays the day's latest version).
    Returns the CSVs written.
    """
    if end < start:
        raise ValueError(f"--end {end} is before --start {start}; give an end on or after start.")
    if not 1 <= rows <= MAX_ROWS:
        raise ValueError(f"rows must be between 1 and {MAX_ROWS}, got {rows}.")
    paths = []
    day = start
    while day <= end:
        if not (
            missing_only and csv_path(root, day).exists() and manifest_path(root, day).exists()
        ):
            trips = _original_trips(day, rows)
            paths.append(_write_day(root, day, trips, rows=len(trips), version=1))
        day += timedelta(days=1)
    return paths


def correct(root: Path, day: date, changed: int = 10, removed: int = 5) -> Path:
    """Rewrite a day as a corrected file: new fares for ``changed`` trips, ``removed`` trips gone.

    Changed trips get a different fare and tip and their updated_at moves one day later; the
    manifest's rows drop by the removed rows and its version goes up by one.
    """
    if changed < 0 or removed < 0 or changed + removed < 1:
        raise ValueError(
            f"A correction needs changed >= 0, removed >= 0 and at least one of them > 0; got"
            f" changed={changed}, removed={removed}."
        )
    trips, manifest = _load_for_mess(root, day)
    ids = _distinct_ids(trips)
    if changed + removed > len(ids):
        raise ValueError(
            f"Cannot change {changed} and remove {removed} trips on {day}: the file has only"
            f" {len(ids)} distinct trips."
        )
    rng = _mess_rng(day, "correct", manifest)
    picked = rng.sample(ids, changed + removed)
    to_remove = set(picked[changed:])
    new_prices: dict[str, tuple[int, int]] = {}
    first_fare = {trip.trip_id: trip.fare_cents for trip in reversed(trips)}
    for trip_id in picked[:changed]:
        fare = _different_fare(rng, first_fare[trip_id], max_delta=1_500)
        new_prices[trip_id] = (fare, rng.randint(0, _max_tip(fare)))
    corrected = []
    for trip in trips:
        if trip.trip_id in to_remove:
            continue
        if trip.trip_id in new_prices:
            fare, tip = new_prices[trip.trip_id]
            trip = replace(
                trip,
                fare_cents=fare,
                tip_cents=tip,
                updated_at=trip.updated_at + CORRECTION_DELAY,
            )
        corrected.append(trip)
    return _rewrite(root, manifest, trips, corrected, version=manifest.version + 1)


def add_duplicates(root: Path, day: date, count: int = 3) -> Path:
    """Append ``count`` re-sent copies of existing trips: same trip_id, later updated_at, new fare.

    The later copy is the truth. The manifest's rows include the copies (the source declares what
    it sent); the version is unchanged.
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}.")
    trips, manifest = _load_for_mess(root, day)
    ids = _distinct_ids(trips)
    if count > len(ids):
        raise ValueError(f"Cannot re-send {count} trips on {day}: the file has only {len(ids)}.")
    rng = _mess_rng(day, "duplicates", manifest)
    chosen = sorted(rng.sample(ids, count))
    latest: dict[str, _Trip] = {}
    for trip in trips:
        current = latest.get(trip.trip_id)
        if current is None or trip.updated_at >= current.updated_at:
            latest[trip.trip_id] = trip
    resent = []
    for trip_id in chosen:
        base = latest[trip_id]
        fare = _different_fare(rng, base.fare_cents, max_delta=200)
        resent.append(
            replace(
                base,
                fare_cents=fare,
                tip_cents=min(base.tip_cents, _max_tip(fare)),
                updated_at=base.updated_at + timedelta(minutes=rng.randint(10, 240)),
            )
        )
    return _rewrite(root, manifest, trips, trips + resent, version=manifest.version)


def add_stray_row(root: Path, day: date, other_day: date) -> Path:
    """Append one new trip whose pickup_at lies on ``other_day``; the manifest counts it."""
    if other_day == day:
        raise ValueError(f"A stray row must lie on another day than {day}.")
    trips, manifest = _load_for_mess(root, day)
    rng = _mess_rng(day, f"stray/{other_day.isoformat()}", manifest)
    prefix = f"T{other_day:%Y%m%d}-"
    strays = {
        t.trip_id
        for t in trips
        if t.trip_id.startswith(prefix) and t.trip_id[len(prefix) :] >= f"{STRAY_TRIP_BASE:06d}"
    }
    trip_id = _trip_id(other_day, STRAY_TRIP_BASE + len(strays) + 1)
    pickup_at = _day_start(other_day) + timedelta(seconds=rng.randrange(_SECONDS_PER_DAY))
    stray = _random_trip(rng, trip_id, pickup_at)
    return _rewrite(root, manifest, trips, [*trips, stray], version=manifest.version)


def add_bad_passengers(root: Path, day: date, count: int = 2) -> Path:
    """Set passenger_count of ``count`` rows to 0 or 9 (outside 1..6)."""
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}.")
    trips, manifest = _load_for_mess(root, day)
    valid = [
        i for i, t in enumerate(trips) if MIN_PASSENGERS <= t.passenger_count <= MAX_PASSENGERS
    ]
    if count > len(valid):
        raise ValueError(
            f"Cannot spoil {count} passenger counts on {day}: only {len(valid)} rows are valid."
        )
    rng = _mess_rng(day, "bad-passengers", manifest)
    spoiled = list(trips)
    for i in sorted(rng.sample(valid, count)):
        spoiled[i] = replace(spoiled[i], passenger_count=rng.choice((0, 9)))
    return _rewrite(root, manifest, trips, spoiled, version=manifest.version)


def make_stale(root: Path, day: date, hours: int = 6) -> Path:
    """Drop every trip picked up in the last ``hours`` hours of the day, like a late delivery."""
    if not 1 <= hours <= 23:
        raise ValueError(f"hours must be between 1 and 23, got {hours}.")
    trips, manifest = _load_for_mess(root, day)
    end = _day_start(day) + timedelta(days=1)
    cutoff = end - timedelta(hours=hours)
    kept = [t for t in trips if not cutoff <= t.pickup_at < end]
    return _rewrite(root, manifest, trips, kept, version=manifest.version)


def short_manifest(root: Path, day: date, missing: int = 1) -> Path:
    """Rewrite only the manifest, declaring ``missing`` fewer rows (sha256 stays correct)."""
    landing = read_day(root, day)
    if not 1 <= missing <= landing.expected_rows:
        raise ValueError(
            f"missing must be between 1 and the declared {landing.expected_rows} rows,"
            f" got {missing}."
        )
    path = manifest_path(root, day)
    rows = landing.expected_rows - missing
    _atomic_write(path, _manifest_bytes(day, rows, landing.sha256, landing.version))
    return path


def _load_for_mess(root: Path, day: date) -> tuple[list[_Trip], _Manifest]:
    """Read a day through the verifying reader, then as trips that can be edited and rewritten."""
    landing, data = _read(root, day)
    rows = list(csv.reader(io.StringIO(data.decode("utf-8"), newline="")))[1:]
    try:
        trips = [_Trip.from_fields(fields) for fields in rows if fields]
    except ValueError as exc:
        raise CorruptLandingFileError(
            f"Landing file for {day} at {landing.path} holds a value a mess cannot edit ({exc});"
            f" regenerate it with {_generate_command(root, day)} before applying a mess."
        ) from None
    manifest = _Manifest(day, landing.expected_rows, landing.sha256, landing.version)
    return trips, manifest


def _rewrite(
    root: Path, manifest: _Manifest, before: list[_Trip], after: list[_Trip], version: int
) -> Path:
    # Shift the declared rows by the change, so an already short manifest stays short.
    rows = max(0, manifest.rows + len(after) - len(before))
    return _write_day(root, manifest.day, after, rows=rows, version=version)


def _write_day(root: Path, day: date, trips: Sequence[_Trip], rows: int, version: int) -> Path:
    data = _csv_bytes(trips)
    path = csv_path(root, day)
    # CSV first: a crash in between leaves a CSV whose manifest is stale or missing, which the
    # reader refuses, rather than a manifest vouching for bytes that were never written.
    _atomic_write(path, data)
    _atomic_write(
        manifest_path(root, day),
        _manifest_bytes(day, rows, hashlib.sha256(data).hexdigest(), version),
    )
    return path


def _csv_bytes(trips: Sequence[_Trip]) -> bytes:
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows(trip.to_fields() for trip in trips)
    return buffer.getvalue().encode("utf-8")


def _manifest_bytes(day: date, rows: int, sha256: str, version: int) -> bytes:
    manifest = {"date": day.isoformat(), "rows": rows, "sha256": sha256, "version": version}
    return (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp creates 0600; landing files are meant to be read by other processes.
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    if os.name == "posix":
        # Persist the rename itself; without this a power loss can bring back the old name.
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _original_trips(day: date, rows: int) -> list[_Trip]:
    """Return the day's original trips; the seed is the day alone, so other days never matter."""
    rng = random.Random(int(f"{day:%Y%m%d}"))
    last_window = int(LATEST_PICKUP_WITHIN.total_seconds())
    # One pickup in the last window keeps a normal day fresh; the rest spread over the whole day.
    seconds = [rng.randrange(_SECONDS_PER_DAY - last_window, _SECONDS_PER_DAY)]
    seconds += [rng.randrange(_SECONDS_PER_DAY) for _ in range(rows - 1)]
    seconds.sort()
    start = _day_start(day)
    return [
        _random_trip(rng, _trip_id(day, number), start + timedelta(seconds=second))
        for number, second in enumerate(seconds, start=1)
    ]


def _random_trip(rng: random.Random, trip_id: str, pickup_at: datetime) -> _Trip:
    duration = rng.randint(int(MIN_TRIP.total_seconds()), int(MAX_TRIP.total_seconds()))
    fare = rng.randint(MIN_FARE_CENTS, MAX_FARE_CENTS)
    return _Trip(
        trip_id=trip_id,
        pickup_at=pickup_at,
        dropoff_at=pickup_at + timedelta(seconds=duration),
        passenger_count=rng.randint(MIN_PASSENGERS, MAX_PASSENGERS),
        fare_cents=fare,
        tip_cents=rng.randint(0, _max_tip(fare)),
        pickup_zone=rng.choice(ZONES),
        dropoff_zone=rng.choice(ZONES),
        updated_at=pickup_at + UPDATE_DELAY,
    )


def _mess_rng(day: date, mess: str, manifest: _Manifest) -> random.Random:
    # Seeding with the bytes being rewritten (via their sha256) makes a repeated mess, e.g. a
    # second correction, deterministic yet different from the first. str seeds hash with SHA-512,
    # so they do not depend on PYTHONHASHSEED.
    return random.Random(f"{day.isoformat()}/{mess}/{manifest.sha256}")


def _different_fare(rng: random.Random, fare_cents: int, max_delta: int) -> int:
    delta = rng.randint(1, max_delta) * rng.choice((-1, 1))
    if MIN_FARE_CENTS <= fare_cents + delta <= MAX_FARE_CENTS:
        return fare_cents + delta
    return fare_cents - delta


def _max_tip(fare_cents: int) -> int:
    return fare_cents * MAX_TIP_PERCENT // 100


def _trip_id(day: date, number: int) -> str:
    return f"T{day:%Y%m%d}-{number:06d}"


def _day_start(day: date) -> datetime:
    return datetime.combine(day, time())


def _distinct_ids(trips: Sequence[_Trip]) -> list[str]:
    return list(dict.fromkeys(trip.trip_id for trip in trips))


def _format_cents(cents: int) -> str:
    sign = "-" if cents < 0 else ""
    return f"{sign}{abs(cents) // 100}.{abs(cents) % 100:02d}"


def _parse_cents(text: str) -> int:
    try:
        cents = Decimal(text) * 100
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a decimal amount") from None
    if cents != cents.to_integral_value():
        raise ValueError(f"{text!r} has more than 2 decimal places")
    return int(cents)


def _iso_date(text: str) -> date:
    # Only the command line reads the clock: a day's bytes still depend on the day alone.
    if text == "today":
        return datetime.now(UTC).date()
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date like 2026-01-05") from None


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m idem_assets.landing",
        description="Write, damage and list the deterministic taxi-trip landing files.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    root_help = f"landing root (default: ${LANDING_DIR_ENV} or <repo>/.data/landing)"

    gen = commands.add_parser("generate", help="write one original file per day")
    gen.add_argument("--root", type=Path, default=None, help=root_help)
    gen.add_argument("--start", type=_iso_date, required=True, help="first day, YYYY-MM-DD")
    gen.add_argument(
        "--end", type=_iso_date, required=True, help="last day (inclusive), or 'today' (UTC)"
    )
    gen.add_argument("--rows", type=int, default=1000, help="trips per day (default: 1000)")
    gen.add_argument(
        "--missing-only", action="store_true", help="keep the days that already have a file"
    )

    mess = commands.add_parser("mess", help="damage one existing day")
    mess.add_argument("--root", type=Path, default=None, help=root_help)
    mess.add_argument("--day", type=_iso_date, required=True, help="the day to damage")
    kind = mess.add_mutually_exclusive_group(required=True)
    kind.add_argument("--correct", action="store_true", help="rewrite as a corrected file")
    kind.add_argument("--duplicates", type=int, metavar="N", help="append N re-sent trips")
    kind.add_argument("--stray", type=_iso_date, metavar="OTHER_DAY", help="append a stray row")
    kind.add_argument("--bad-passengers", type=int, metavar="N", help="set N passenger counts")
    kind.add_argument("--stale", type=int, metavar="HOURS", help="drop the last HOURS hours")
    kind.add_argument("--short-manifest", type=int, metavar="N", help="declare N rows too few")
    mess.add_argument("--changed", type=int, default=None, help="with --correct (default: 10)")
    mess.add_argument("--removed", type=int, default=None, help="with --correct (default: 5)")

    show = commands.add_parser("show", help="list the days and their manifests")
    show.add_argument("--root", type=Path, default=None, help=root_help)
    return parser


def _describe(root: Path, day: date, path: Path) -> str:
    manifest = _read_manifest(root, day)
    return (
        f"wrote {path}  day={day}  rows={manifest.rows}  version={manifest.version}"
        f"  sha256={manifest.sha256[:12]}"
    )


def _show(root: Path) -> None:
    days = list_days(root)
    if not days:
        print(f"no landing files under {Path(root) / TRIPS_DIR}")
        return
    print(f"{'day':<10}  {'rows':>6}  {'version':>7}  {'sha256':<12}  csv")
    for day in days:
        try:
            manifest = _read_manifest(root, day)
        except ManifestMismatchError:
            print(f"{day.isoformat():<10}  {'?':>6}  {'?':>7}  {'?':<12}  invalid manifest")
            continue
        fingerprint = landing_fingerprint(root, day)
        status = (
            "missing"
            if fingerprint is None
            else "ok"
            if fingerprint == manifest.sha256
            else "differs from manifest"
        )
        print(
            f"{day.isoformat():<10}  {manifest.rows:>6}  {manifest.version:>7}"
            f"  {manifest.sha256[:12]:<12}  {status}"
        )


def _run_mess(parser: argparse.ArgumentParser, args: argparse.Namespace, root: Path) -> Path:
    day: date = args.day
    if not args.correct and (args.changed is not None or args.removed is not None):
        parser.error("--changed and --removed only apply with --correct")
    if args.correct:
        changed = 10 if args.changed is None else args.changed
        removed = 5 if args.removed is None else args.removed
        return correct(root, day, changed=changed, removed=removed)
    if args.duplicates is not None:
        return add_duplicates(root, day, count=args.duplicates)
    if args.stray is not None:
        return add_stray_row(root, day, other_day=args.stray)
    if args.bad_passengers is not None:
        return add_bad_passengers(root, day, count=args.bad_passengers)
    if args.stale is not None:
        return make_stale(root, day, hours=args.stale)
    return short_manifest(root, day, missing=args.short_manifest)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return 0 on success, 2 for bad arguments, 1 for unreadable files."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    root: Path = args.root if args.root is not None else default_landing_dir()
    try:
        if args.command == "generate":
            written = generate(
                root, args.start, args.end, rows=args.rows, missing_only=args.missing_only
            )
            for path in written:
                print(_describe(root, date.fromisoformat(path.name.removesuffix(".csv")), path))
            if args.missing_only:
                kept = (args.end - args.start).days + 1 - len(written)
                print(f"kept {kept} day(s) that already had a file")
        elif args.command == "mess":
            path = _run_mess(parser, args, root)
            print(_describe(root, args.day, path))
        else:
            _show(root)
    except (ValueError, MissingLandingFileError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    except LandingFileError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
