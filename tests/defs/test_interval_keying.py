"""Interval keying: what a run writes depends on its partition, never on the wall clock."""

import ast
from datetime import UTC, datetime
from pathlib import Path

import time_machine

import idem_assets

from .support import TABLES, MakePipeline, days

PACKAGE = Path(idem_assets.__file__).parent
#: The code location and the audit: everything that decides what a partition holds.
SCANNED = [*sorted((PACKAGE / "defs").glob("*.py")), PACKAGE / "lib" / "dagster_layer" / "audit.py"]
CLOCK_CALLS = {
    ("datetime", "now"),
    ("datetime", "utcnow"),
    ("datetime", "today"),
    ("date", "today"),
    ("time", "time"),
    ("time", "time_ns"),
    ("pendulum", "now"),
    ("pendulum", "today"),
}


def test_the_same_partition_under_two_clocks_writes_the_same_tables(
    make_pipeline: MakePipeline,
) -> None:
    february = make_pipeline("february")
    february.generate("2026-01-01", "2026-01-02")
    september = make_pipeline("september", root=february.root)

    for clock, pipeline in [
        (datetime(2026, 2, 1, 3, 0, tzinfo=UTC), february),
        (datetime(2026, 9, 15, 22, 30, tzinfo=UTC), september),
    ]:
        with time_machine.travel(clock, tick=False):
            for day in days("2026-01-01", "2026-01-02"):
                pipeline.run_ok(day)

    expected = february.fingerprints()
    assert set(expected) == set(TABLES) and all(expected.values())
    assert september.fingerprints() == expected


def clock_calls(path: Path, base: Path = PACKAGE.parent) -> list[str]:
    """``file:line: call()`` for every call in ``path`` that reads the wall clock."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    # Local names of the clock modules and classes (`import datetime as dt`), and of clock
    # functions imported bare (`from time import time`).
    aliases = {"datetime": "datetime", "date": "date", "time": "time", "pendulum": "pendulum"}
    bare: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("datetime", "time", "pendulum"):
            for alias in node.names:
                local = alias.asname or alias.name
                if (node.module, alias.name) in CLOCK_CALLS:
                    bare[local] = (node.module, alias.name)
                else:
                    aliases[local] = alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name] = alias.name.split(".")[-1]
    offenders = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func, name = node.func, None
        if isinstance(func, ast.Attribute):
            # datetime.datetime.now() as well as datetime.now()
            owner = getattr(func.value, "attr", None) or getattr(func.value, "id", "")
            name = (aliases.get(owner, owner), func.attr)
        elif isinstance(func, ast.Name):
            name = bare.get(func.id)
        if name in CLOCK_CALLS:
            offenders.append(f"{path.relative_to(base)}:{node.lineno}: {ast.unparse(func)}()")
    return sorted(offenders, key=lambda line: int(line.split(":")[1]))


def test_no_asset_check_or_audit_reads_the_wall_clock() -> None:
    assert len(SCANNED) > 5
    offenders = [line for path in SCANNED for line in clock_calls(path)]
    assert offenders == [], "wall-clock calls:\n" + "\n".join(offenders)


def test_the_clock_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import datetime as dt\n"
        "import time\n"
        "from datetime import date, datetime\n"
        "from time import time as now\n"
        "a = datetime.now()\n"
        "b = date.today()\n"
        "c = time.time()\n"
        "d = dt.datetime.now()\n"
        "e = now()\n"
        "f = datetime.fromisoformat('2026-01-01')\n"
    )
    assert clock_calls(sample, base=tmp_path) == [
        "sample.py:5: datetime.now()",
        "sample.py:6: date.today()",
        "sample.py:7: time.time()",
        "sample.py:8: dt.datetime.now()",
        "sample.py:9: now()",
    ]
