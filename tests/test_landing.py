"""Tests for the deterministic landing zone."""

import hashlib
import json
import os
import subprocess
import sys
from datetime import date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idem_assets import landing
from idem_assets.landing import (
    CorruptLandingFileError,
    LandingFileError,
    ManifestMismatchError,
    MissingLandingFileError,
    add_bad_passengers,
    add_duplicates,
    add_stray_row,
    correct,
    csv_path,
    generate,
    landing_fingerprint,
    list_days,
    make_stale,
    manifest_path,
    read_day,
    short_manifest,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
DAY = date(2026, 1, 5)
ROWS = 200


def rows_by_id(root: Path, day: date) -> dict[str, dict]:
    rows = read_day(root, day).table.to_pylist()
    by_id = {row["trip_id"]: row for row in rows}
    assert len(by_id) == len(rows), "expected unique trip_ids"
    return by_id


def end_of(day: date) -> datetime:
    return datetime(day.year, day.month, day.day) + timedelta(days=1)


def start_cli(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop(landing.LANDING_DIR_ENV, None)
    return subprocess.Popen(
        [sys.executable, "-m", "idem_assets.landing", *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    stdout, stderr = process.communicate(timeout=120)
    return process.returncode, stdout, stderr


@pytest.fixture
def root(tmp_path: Path) -> Path:
    generate(tmp_path, DAY, DAY, rows=ROWS)
    return tmp_path


def test_same_day_gives_identical_bytes_regardless_of_range_and_order(tmp_path: Path) -> None:
    one, other = tmp_path / "one", tmp_path / "other"
    days = [date(2026, 1, 1), date(2026, 1, 2), date(2026, 1, 3)]
    generate(one, days[0], days[-1], rows=300)
    generate(one, days[0], days[-1], rows=300)  # a rerun overwrites with the same bytes
    for day in reversed(days):
        generate(other, day, day, rows=300)
    generate(other, date(2026, 1, 2), date(2026, 1, 4), rows=300)  # overlapping range

    for day in days:
        assert csv_path(one, day).read_bytes() == csv_path(other, day).read_bytes()
        assert manifest_path(one, day).read_bytes() == manifest_path(other, day).read_bytes()
    assert csv_path(one, days[0]).read_bytes() != csv_path(one, days[1]).read_bytes()
    assert list_days(other) == [*days, date(2026, 1, 4)]


def test_generate_returns_csv_paths_and_leaves_no_temp_files(tmp_path: Path) -> None:
    paths = generate(tmp_path, date(2026, 2, 27), date(2026, 3, 1), rows=5)

    assert [p.name for p in paths] == ["2026-02-27.csv", "2026-02-28.csv", "2026-03-01.csv"]
    assert sorted(p.name for p in (tmp_path / "trips").iterdir()) == [
        "2026-02-27.csv",
        "2026-02-27.manifest.json",
        "2026-02-28.csv",
        "2026-02-28.manifest.json",
        "2026-03-01.csv",
        "2026-03-01.manifest.json",
    ]


def test_manifest_content_and_format(root: Path) -> None:
    data = csv_path(root, DAY).read_bytes()
    text = manifest_path(root, DAY).read_text()

    expected = {
        "date": "2026-01-05",
        "rows": ROWS,
        "sha256": hashlib.sha256(data).hexdigest(),
        "version": 1,
    }
    assert json.loads(text) == expected
    assert text == json.dumps(expected, indent=2, sort_keys=True) + "\n"


def test_csv_text_format(root: Path) -> None:
    data = csv_path(root, DAY).read_bytes()
    lines = data.decode().split("\n")

    assert b"\r" not in data
    assert data.endswith(b"\n")
    assert lines[0] == ",".join(landing.COLUMNS)
    assert lines[1].startswith("T20260105-000001,2026-01-05 ")
    assert b'"Park Slope, Brooklyn"' in data  # the zone with a comma is quoted


def test_read_day_schema_and_values(tmp_path: Path) -> None:
    generate(tmp_path, DAY, DAY, rows=1000)
    result = read_day(tmp_path, DAY)
    table = result.table

    assert table.schema == pa.schema(
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
    assert result.expected_rows == 1000
    assert table.num_rows == 1000
    assert result.version == 1
    assert result.day == DAY
    assert result.path == csv_path(tmp_path, DAY)
    assert result.sha256 == hashlib.sha256(result.path.read_bytes()).hexdigest()

    rows = table.to_pylist()
    assert [r["trip_id"] for r in rows] == [f"T20260105-{n:06d}" for n in range(1, 1001)]
    start = datetime(2026, 1, 5)
    for r in rows:
        assert start <= r["pickup_at"] < end_of(DAY)
        assert timedelta(minutes=3) <= r["dropoff_at"] - r["pickup_at"] <= timedelta(minutes=90)
        assert r["updated_at"] == r["pickup_at"] + timedelta(hours=2)
        assert 1 <= r["passenger_count"] <= 6
        assert 2.50 <= r["fare"] <= 150.00
        assert 0 <= r["tip"] <= round(r["fare"] * 0.30, 2)
        assert r["pickup_zone"] in landing.ZONES
        assert r["dropoff_zone"] in landing.ZONES
    # spread over the whole day, not bunched up
    assert {r["pickup_at"].hour for r in rows} == set(range(24))


@pytest.mark.parametrize("rows", [1, 2, 1000])
def test_latest_pickup_of_a_normal_day_is_within_the_last_hour(tmp_path: Path, rows: int) -> None:
    for offset in range(5):
        day = DAY + timedelta(days=offset)
        generate(tmp_path, day, day, rows=rows)
        latest = max(read_day(tmp_path, day).table.column("pickup_at").to_pylist())
        assert end_of(day) - timedelta(hours=1) <= latest < end_of(day)


@settings(max_examples=25, deadline=None)
@given(
    day=st.dates(min_value=date(2000, 1, 1), max_value=date(2099, 12, 31)),
    rows=st.integers(min_value=1, max_value=30),
)
def test_any_generated_day_reads_back(
    tmp_path_factory: pytest.TempPathFactory, day: date, rows: int
) -> None:
    root = tmp_path_factory.mktemp("landing")
    generate(root, day, day, rows=rows)
    result = read_day(root, day)

    assert result.expected_rows == result.table.num_rows == rows
    pickups = result.table.column("pickup_at").to_pylist()
    assert all(p.date() == day for p in pickups)
    assert max(pickups) >= end_of(day) - timedelta(hours=1)


def test_generate_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="before --start"):
        generate(tmp_path, date(2026, 1, 2), date(2026, 1, 1))
    with pytest.raises(ValueError, match="rows"):
        generate(tmp_path, DAY, DAY, rows=0)
    assert not (tmp_path / "trips").exists()


def test_default_landing_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("IDEM_LANDING_DIR", str(tmp_path / "elsewhere"))
    assert landing.default_landing_dir() == tmp_path / "elsewhere"
    monkeypatch.delenv("IDEM_LANDING_DIR")
    assert landing.default_landing_dir() == REPO_ROOT / ".data" / "landing"


def test_fingerprint_and_list_days(root: Path) -> None:
    assert landing_fingerprint(root, DAY) == read_day(root, DAY).sha256
    assert landing_fingerprint(root, DAY + timedelta(days=1)) is None
    assert list_days(root / "nowhere") == []

    (root / "trips" / "notes.manifest.json").write_text("{}")
    (root / "trips" / "20260107.manifest.json").write_text("{}")
    generate(root, date(2026, 1, 3), date(2026, 1, 3), rows=3)
    assert list_days(root) == [date(2026, 1, 3), DAY]

    before = landing_fingerprint(root, DAY)
    add_duplicates(root, DAY, count=1)
    assert landing_fingerprint(root, DAY) not in (None, before)


def test_correct_changes_fares_removes_trips_and_bumps_version(root: Path) -> None:
    before = rows_by_id(root, DAY)

    correct(root, DAY, changed=10, removed=5)

    after = rows_by_id(root, DAY)
    result = read_day(root, DAY)
    assert len(set(before) - set(after)) == 5
    assert set(after) <= set(before)
    changed = [i for i in after if after[i]["fare"] != before[i]["fare"]]
    assert len(changed) == 10
    for trip_id in changed:
        assert after[trip_id]["updated_at"] == before[trip_id]["updated_at"] + timedelta(days=1)
        assert 0 <= after[trip_id]["tip"] <= round(after[trip_id]["fare"] * 0.30, 2)
    for trip_id in set(after) - set(changed):
        assert after[trip_id] == before[trip_id]
    assert result.version == 2
    assert result.expected_rows == ROWS - 5 == result.table.num_rows


def test_correct_twice_gives_version_3_deterministically(tmp_path: Path) -> None:
    outputs = []
    for name in ("a", "b"):
        root = tmp_path / name
        generate(root, DAY, DAY, rows=ROWS)
        correct(root, DAY)
        version_2 = rows_by_id(root, DAY)
        correct(root, DAY, changed=4, removed=3)
        result = read_day(root, DAY)
        assert result.version == 3
        assert result.expected_rows == ROWS - 5 - 3 == result.table.num_rows
        version_3 = rows_by_id(root, DAY)
        assert len(set(version_2) - set(version_3)) == 3
        assert sum(version_3[i]["fare"] != version_2[i]["fare"] for i in version_3) == 4
        outputs.append((csv_path(root, DAY).read_bytes(), manifest_path(root, DAY).read_bytes()))
    assert outputs[0] == outputs[1]


def test_duplicates_share_trip_id_with_later_updated_at(root: Path) -> None:
    before = rows_by_id(root, DAY)

    add_duplicates(root, DAY, count=3)

    result = read_day(root, DAY)
    rows = result.table.to_pylist()
    assert result.expected_rows == ROWS + 3 == len(rows)
    assert result.version == 1
    assert rows[:ROWS] == list(before.values())
    resent = rows[ROWS:]
    assert len({r["trip_id"] for r in resent}) == 3
    for r in resent:
        original = before[r["trip_id"]]
        assert r["updated_at"] > original["updated_at"]
        assert r["fare"] != original["fare"]
        assert abs(r["fare"] - original["fare"]) <= 2.00
        assert r["pickup_at"] == original["pickup_at"]


def test_stray_row_lies_on_the_other_day(root: Path) -> None:
    other = date(2026, 1, 4)

    add_stray_row(root, DAY, other)

    result = read_day(root, DAY)
    pickups = result.table.column("pickup_at").to_pylist()
    assert result.expected_rows == ROWS + 1 == len(pickups)
    assert [p.date() for p in pickups].count(other) == 1
    assert pickups[-1].date() == other
    assert result.table.column("trip_id")[-1].as_py() == "T20260104-900001"
    with pytest.raises(ValueError, match="another day"):
        add_stray_row(root, DAY, DAY)


def test_bad_passengers(root: Path) -> None:
    add_bad_passengers(root, DAY, count=2)

    result = read_day(root, DAY)
    counts = result.table.column("passenger_count").to_pylist()
    bad = [c for c in counts if not 1 <= c <= 6]
    assert len(bad) == 2
    assert set(bad) <= {0, 9}
    assert result.expected_rows == ROWS == len(counts)


def test_stale_drops_the_last_hours(root: Path) -> None:
    before = read_day(root, DAY).table.to_pylist()
    cutoff = end_of(DAY) - timedelta(hours=6)

    make_stale(root, DAY, hours=6)

    result = read_day(root, DAY)
    rows = result.table.to_pylist()
    assert rows == [r for r in before if r["pickup_at"] < cutoff]
    assert 0 < len(rows) < ROWS
    assert result.expected_rows == len(rows)
    assert max(r["pickup_at"] for r in rows) < cutoff


def test_short_manifest(root: Path) -> None:
    data = csv_path(root, DAY).read_bytes()

    short_manifest(root, DAY, missing=2)

    result = read_day(root, DAY)
    assert result.expected_rows == ROWS - 2
    assert result.table.num_rows == ROWS
    assert csv_path(root, DAY).read_bytes() == data
    assert result.sha256 == hashlib.sha256(data).hexdigest()
    # a later mess shifts the declared rows by its own change, so the shortfall stays
    add_duplicates(root, DAY, count=1)
    assert read_day(root, DAY).expected_rows == ROWS - 1


def test_messes_refuse_missing_or_changed_files(root: Path) -> None:
    with pytest.raises(MissingLandingFileError):
        correct(root, date(2026, 1, 9))
    path = csv_path(root, DAY)
    path.write_bytes(path.read_bytes().replace(b"T20260105-000001", b"T20260105-999999"))
    with pytest.raises(ManifestMismatchError):
        add_duplicates(root, DAY)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(MissingLandingFileError) as excinfo:
        read_day(tmp_path, DAY)

    message = str(excinfo.value)
    assert isinstance(excinfo.value, LandingFileError)
    assert "2026-01-05" in message
    assert str(csv_path(tmp_path, DAY)) in message
    assert "generate --root" in message


def test_truncated_file(root: Path) -> None:
    path = csv_path(root, DAY)
    data = path.read_bytes()
    line_50_start = data.index(b"T20260105-000050")
    path.write_bytes(data[: line_50_start + 40])  # cut in the middle of line 51

    with pytest.raises(CorruptLandingFileError) as excinfo:
        read_day(root, DAY)

    message = str(excinfo.value)
    assert "truncated" in message
    assert "line 51" in message
    assert str(path) in message
    assert "generate --root" in message


def test_non_numeric_passenger_count(root: Path) -> None:
    path = csv_path(root, DAY)
    lines = path.read_bytes().split(b"\n")
    fields = lines[7].split(b",")
    fields[3] = b"abc"
    lines[7] = b",".join(fields)
    path.write_bytes(b"\n".join(lines))

    with pytest.raises(CorruptLandingFileError) as excinfo:
        read_day(root, DAY)

    message = str(excinfo.value)
    assert "line 8, column passenger_count: 'abc'" in message
    assert "2026-01-05" in message


def test_wrong_header(root: Path) -> None:
    path = csv_path(root, DAY)
    path.write_bytes(path.read_bytes().replace(b"fare,tip", b"tip,fare", 1))

    with pytest.raises(CorruptLandingFileError, match="header"):
        read_day(root, DAY)


def test_modified_file_mismatches_its_manifest(root: Path) -> None:
    path = csv_path(root, DAY)
    data = path.read_bytes()
    first_fare = data.split(b"\n")[1].split(b",")[4]
    path.write_bytes(data.replace(b"," + first_fare + b",", b",0.01,", 1))

    with pytest.raises(ManifestMismatchError) as excinfo:
        read_day(root, DAY)

    message = str(excinfo.value)
    assert hashlib.sha256(path.read_bytes()).hexdigest() in message
    assert "rewrite the manifest or restore the file" in message


def test_missing_or_invalid_manifest(root: Path) -> None:
    manifest = manifest_path(root, DAY)
    manifest.write_text("{not json")
    with pytest.raises(ManifestMismatchError, match="not valid JSON"):
        read_day(root, DAY)

    manifest.write_text(json.dumps({"date": "2026-01-05", "rows": "200", "version": 1}))
    with pytest.raises(ManifestMismatchError, match=r"rows is '200'.*sha256 is None"):
        read_day(root, DAY)

    manifest.unlink()
    with pytest.raises(ManifestMismatchError, match="no manifest"):
        read_day(root, DAY)


def test_reader_does_not_check_counts_or_ranges(root: Path) -> None:
    add_bad_passengers(root, DAY)
    short_manifest(root, DAY)

    result = read_day(root, DAY)
    assert result.table.num_rows == result.expected_rows + 1


def test_cli_generate_mess_and_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Each subprocess pays for importing dagster through the package, so the independent
    # bad-argument run overlaps with the others and everything else runs in-process.
    backwards = start_cli(
        "generate", "--root", str(tmp_path / "other"), "--start", "2026-01-05",
        "--end", "2026-01-01",
    )  # fmt: skip
    code, out, err = finish(
        start_cli(
            "generate", "--root", str(tmp_path), "--start", "2026-01-01", "--end", "2026-01-02",
            "--rows", "50",
        )
    )  # fmt: skip
    assert code == 0, err
    assert len(out.splitlines()) == 2
    assert list_days(tmp_path) == [date(2026, 1, 1), date(2026, 1, 2)]
    assert csv_path(tmp_path, date(2026, 1, 1)).read_bytes() == (
        landing._csv_bytes(landing._original_trips(date(2026, 1, 1), 50))
    )

    code, out, err = finish(
        start_cli(
            "mess", "--root", str(tmp_path), "--day", "2026-01-02", "--correct",
            "--changed", "2", "--removed", "1",
        )
    )  # fmt: skip
    assert code == 0, err
    assert "version=2" in out
    result = read_day(tmp_path, date(2026, 1, 2))
    assert (result.version, result.expected_rows) == (2, 49)

    assert landing.main(["show", "--root", str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [
        f"2026-01-01      50        1  {read_day(tmp_path, date(2026, 1, 1)).sha256[:12]}  ok",
        f"2026-01-02      49        2  {result.sha256[:12]}  ok",
    ]

    code, out, err = finish(backwards)
    assert code == 2
    assert "--end 2026-01-01 is before --start 2026-01-05" in err
    assert not (tmp_path / "other").exists()


def test_cli_bad_arguments_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "--root", str(tmp_path), "--start", "2026-01-05", "--end", "2026-01-01"]
    assert landing.main(argv) == 2
    assert "before --start" in capsys.readouterr().err

    assert (
        landing.main(["mess", "--root", str(tmp_path), "--day", "2026-01-05", "--stale", "3"]) == 2
    )
    assert "No landing file for 2026-01-05" in capsys.readouterr().err
    assert not (tmp_path / "trips").exists()

    generate(tmp_path, DAY, DAY, rows=3)
    assert (
        landing.main(["mess", "--root", str(tmp_path), "--day", "2026-01-05", "--duplicates", "4"])
        == 2
    )
    assert "only 3" in capsys.readouterr().err
    with pytest.raises(SystemExit) as excinfo:
        landing.main(
            [
                "mess",
                "--root",
                str(tmp_path),
                "--day",
                "2026-01-05",
                "--stale",
                "3",
                "--changed",
                "1",
            ]
        )
    assert excinfo.value.code == 2
    assert "only apply with --correct" in capsys.readouterr().err
    with pytest.raises(SystemExit) as excinfo:
        landing.main(
            ["generate", "--root", str(tmp_path), "--start", "2026-13-01", "--end", "2026-01-01"]
        )
    assert excinfo.value.code == 2


def test_cli_unreadable_file_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    generate(tmp_path, DAY, DAY, rows=3)
    manifest_path(tmp_path, DAY).unlink()
    assert landing.main(["mess", "--root", str(tmp_path), "--day", "2026-01-05", "--correct"]) == 1
    assert "has no manifest" in capsys.readouterr().err
    assert landing.main(["show", "--root", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("no landing files under")
