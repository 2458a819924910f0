"""11. The plan of one partition's rerun vs the publish it previews, overwrite and merge."""

from pathlib import Path

import duckdb
import pyarrow as pa

import idem_assets as ia
from benchmarks import data
from benchmarks.harness import Case, Line, Scale, interleave, line_from_times

#: (rows per partition, rounds) per scale.
SIZES: dict[Scale, tuple[int, int]] = {"tiny": (1_000, 2), "full": (1_000_000, 11)}
#: Partitions already in the table besides the one that is planned and published.
OTHER_PARTITIONS = 4
TARGET_DAY = OTHER_PARTITIONS
#: The share of a day's rows a typical correction changes (the rest are as stored).
CORRECTED_SHARE = 0.01


def run(scale: Scale, repeat: int | None, workdir: Path) -> list[Line]:
    """``ia.plan`` vs ``ia.publish`` of the same batch, on DuckDB files held open."""
    rows, rounds = SIZES[scale]
    lines = [_compare(mode, rows, repeat or rounds, workdir) for mode in ("overwrite", "merge")]
    return [*lines, _compare("overwrite", rows, repeat or rounds, workdir, CORRECTED_SHARE)]


def _compare(
    mode: ia.WriteMode, rows: int, rounds: int, workdir: Path, share: float | None = None
) -> Line:
    # A corrected day: the table holds an older version of it (another seed, or with ``share``
    # the same rows but a few fares) and other days.
    setup = [data.trips(d, rows, seed=1) for d in range(OTHER_PARTITIONS + 1)]
    batch = data.trips(TARGET_DAY, rows) if share is None else _fares_fixed(setup[-1], share)
    settings = data.settings(mode)
    window = data.window([TARGET_DAY])
    name = f"{mode}_{rows}" + ("" if share is None else "_corrected")
    planned = duckdb.connect(str(workdir / f"plan_{name}.duckdb"))
    published = duckdb.connect(str(workdir / f"publish_{name}.duckdb"))
    try:
        data.load(planned, setup)
        data.load(published, setup)
        untouched = ia.table_fingerprint(planned, "main", data.TABLE)
        times = interleave(
            [
                Case("plan", lambda: ia.plan(planned, batch, settings, window, now=data.NOW)),
                Case(
                    "publish",
                    lambda: ia.publish(published, batch, settings, window, now=data.NOW),
                ),
            ],
            rounds,
        )
        # The plan wrote nothing, and it previews exactly what the publish left.
        preview = ia.plan(planned, batch, settings, window, now=data.NOW)
        stored = ia.table_fingerprint(published, "main", data.TABLE, data.PARTITION_COLUMN, window)
        equal = (
            ia.table_fingerprint(planned, "main", data.TABLE) == untouched
            and preview.total.fingerprint_after == stored
        )
    finally:
        planned.close()
        published.close()
    label = f"{rows // 1_000_000}M rows" if rows >= 1_000_000 else f"{rows // 1_000}k rows"
    fixed = "" if share is None else f", {share:.0%} of rows corrected"
    return line_from_times(
        f"11 plan {mode}{fixed}",
        label,
        times,
        "plan",
        "publish",
        target=("<=", 1.3),
        equal=equal,
        notes=[
            f"the plan of a corrected day ({label}"
            + (", every row different" if share is None else f", {share:.0%} of its fares fixed")
            + f") against the publish of it, in a table of {OTHER_PARTITIONS} other days;"
            " equal: the plan left the table as it was and its planned fingerprint is the one"
            " the publish recorded"
        ],
    )


def _fares_fixed(day: pa.Table, share: float) -> pa.Table:
    """``day`` with the fares of its first ``share`` of rows raised by one."""
    fares = day.column("fare").to_numpy().copy()
    fares[: max(1, int(len(fares) * share))] += 1.0
    return day.set_column(day.schema.get_field_index("fare"), "fare", pa.array(fares))
