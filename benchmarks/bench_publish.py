"""1. Overwrite publish of one partition vs raw DuckDB, and the cost of the audit."""

from datetime import timedelta
from pathlib import Path

import duckdb

import idem_assets as ia
from benchmarks import data
from benchmarks.harness import Case, Line, Scale, interleave, line_from_times

#: (rows per partition, rounds) per scale.
SIZES: dict[Scale, list[tuple[int, int]]] = {
    "tiny": [(1_000, 2), (10_000, 2)],
    "full": [(100_000, 21), (1_000_000, 11)],
}
#: Partitions already in the table besides the one that is overwritten.
OTHER_PARTITIONS = 4
TARGET_DAY = OTHER_PARTITIONS


def typical_checks(rows: int) -> list[ia.Check]:
    """The checks a typical trips asset declares (plus the always-on in_window)."""
    return [
        ia.row_count(rows),
        ia.not_null(data.KEY, data.PARTITION_COLUMN, "fare"),
        ia.unique(data.KEY),
        ia.between("fare", 0, 1_000),
        ia.freshness(data.PARTITION_COLUMN, timedelta(hours=1)),
        ia.in_window(data.PARTITION_COLUMN),
    ]


def _label(rows: int) -> str:
    return f"{rows // 1_000_000}M rows" if rows >= 1_000_000 else f"{rows // 1_000}k rows"


def run(scale: Scale, repeat: int | None, workdir: Path) -> list[Line]:
    """Publish vs ``BEGIN; DELETE; INSERT; COMMIT`` on held connections to on-disk files."""
    largest = max(rows for rows, _ in SIZES[scale])
    lines = []
    for rows, rounds in SIZES[scale]:
        lines += _compare(rows, repeat or rounds, workdir, with_target=rows == largest)
    return lines


def _compare(rows: int, rounds: int, workdir: Path, with_target: bool) -> list[Line]:
    batch = data.trips(TARGET_DAY, rows)
    # The table holds other days and an older version of the day being overwritten.
    setup = [data.trips(d, rows, seed=1) for d in range(OTHER_PARTITIONS + 1)]
    settings = data.settings("overwrite")
    window = data.window([TARGET_DAY])
    start, end = data.day_bounds(TARGET_DAY)
    checks = typical_checks(rows)
    report = ia.audit_table(batch, checks, data.PARTITION_COLUMN, window)
    failed = [v.check.name for v in report.verdicts if not v.passed]
    if failed:
        raise AssertionError(f"benchmark batch fails its own checks: {failed}")

    ours = duckdb.connect(str(workdir / f"publish_ours_{rows}.duckdb"))
    raw = duckdb.connect(str(workdir / f"publish_raw_{rows}.duckdb"))
    try:
        data.load(ours, setup)
        data.load(raw, setup)
        times = interleave(
            [
                Case("publish", lambda: ia.publish(ours, batch, settings, window, now=data.NOW)),
                Case("raw SQL", lambda: data.raw_overwrite(raw, batch, start, end)),
                Case(
                    "audit_table",
                    lambda: ia.audit_table(batch, checks, data.PARTITION_COLUMN, window),
                ),
            ],
            rounds,
        )
        equal = ia.table_fingerprint(ours, "main", data.TABLE) == ia.table_fingerprint(
            raw, "main", data.TABLE
        )
    finally:
        ours.close()
        raw.close()
    label = _label(rows)
    publish = line_from_times(
        "1 overwrite",
        label,
        times,
        "publish",
        "raw SQL",
        target=("<=", 1.3) if with_target else None,
        equal=equal,
        notes=[
            f"{label} ({batch.nbytes / 1e6:.0f} MB Arrow) into a table holding"
            f" {OTHER_PARTITIONS} other partitions and the old version of the day; the"
            " target (<= 1.3x) applies to the larger size"
        ],
    )
    audit = line_from_times(
        "1 audit",
        label,
        times,
        "audit_table",
        "raw SQL",
        notes=[
            f"audit_table with {len(checks)} checks (row_count, not_null, unique, between,"
            " freshness, in_window) on the staged batch, against the raw write's time"
        ],
    )
    return [publish, audit]
