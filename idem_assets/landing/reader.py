"""The pipeline's reader: one day's CSV, parsed and verified against its manifest."""

import csv
import hashlib
import io
import json
import re
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv

from idem_assets.landing.layout import (
    COLUMNS,
    LANDING_DIR_ENV,
    SCHEMA,
    TIMESTAMP_FORMAT,
    TRIPS_DIR,
    _generate_command,
    csv_path,
    manifest_path,
)

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
