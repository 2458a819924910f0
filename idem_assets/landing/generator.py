"""The test-data generator: original days and the messes real feeds make."""

import csv
import hashlib
import io
import json
import os
import random
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path

from idem_assets.landing.layout import (
    COLUMNS,
    TIMESTAMP_FORMAT,
    _generate_command,
    csv_path,
    manifest_path,
)
from idem_assets.landing.reader import (
    CorruptLandingFileError,
    _Manifest,
    _read,
    read_day,
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
