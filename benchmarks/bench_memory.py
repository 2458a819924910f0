"""6. Memory: peak RSS of a publish in a fresh process, over a baseline process, vs Arrow size.

Each measurement is its own subprocess (``python -m benchmarks.bench_memory --child ...``). Every
child imports the same modules, builds the same batch, opens the same database and runs one query;
then it resets the kernel's peak-RSS mark and does its work (nothing, our publish, or the raw
SQL). The increment is the child's peak minus the baseline child's peak of the same round.
"""

import argparse
import gc
import json
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb

import idem_assets as ia
from benchmarks import data
from benchmarks.harness import ROOT, Line, Scale

#: (rows, rounds) per scale.
SIZES: dict[Scale, tuple[int, int]] = {"tiny": (20_000, 1), "full": (1_000_000, 3)}
OTHER_PARTITIONS = 2
TARGET_DAY = OTHER_PARTITIONS
MODES = ("baseline", "publish", "raw SQL")


def _status_kb(field: str) -> int | None:
    try:
        match = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M)
    except OSError:
        return None
    return int(match.group(1)) if match else None


def _reset_peak() -> bool:
    # Writing 5 to clear_refs resets VmHWM (Linux >= 4.0), so the peak excludes building the batch.
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def child(mode: str, rows: int, database: str) -> dict[str, float]:
    """Build the batch, open the database, then do ``mode``'s work; report peak and sizes in KB."""
    batch = data.trips(TARGET_DAY, rows)
    conn = duckdb.connect(database)
    conn.execute(f"SELECT count(*) FROM {data.TABLE}").fetchall()
    gc.collect()
    before = _status_kb("VmRSS") or 0
    reset = _reset_peak()
    if mode == "publish":
        ia.publish(conn, batch, data.settings("overwrite"), data.window([TARGET_DAY]), now=data.NOW)
    elif mode == "raw SQL":
        data.raw_overwrite(conn, batch, *data.day_bounds(TARGET_DAY))
    conn.close()
    peak = _status_kb("VmHWM") if reset else None
    if peak is None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_kb": peak, "rss_before_kb": before, "nbytes": batch.nbytes, "reset": reset}


def _spawn(mode: str, rows: int, database: Path) -> dict[str, float]:
    out = subprocess.run(
        [
            *(sys.executable, "-m", "benchmarks.bench_memory"),
            *("--child", mode, "--rows", str(rows), "--database", str(database)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(scale: Scale, repeat: int | None, workdir: Path) -> list[Line]:
    """Rounds of baseline, publish and raw children (order flipping), each on a fresh copy."""
    rows, rounds = SIZES[scale]
    template = workdir / "memory_template.duckdb"
    conn = duckdb.connect(str(template))
    data.load(conn, [data.trips(d, rows, seed=1) for d in range(OTHER_PARTITIONS + 1)])
    conn.close()
    peaks: dict[str, list[float]] = {m: [] for m in MODES}
    nbytes = 0.0
    for r in range(repeat or rounds):
        for mode in MODES if r % 2 == 0 else tuple(reversed(MODES)):
            copy = workdir / f"memory_{r}_{mode.replace(' ', '_')}.duckdb"
            shutil.copyfile(template, copy)
            result = _spawn(mode, rows, copy)
            copy.unlink()
            Path(f"{copy}.wal").unlink(missing_ok=True)
            peaks[mode].append(result["peak_kb"] * 1024 / 1e6)
            nbytes = result["nbytes"] / 1e6
    base = peaks["baseline"]
    label = f"{rows // 1_000_000}M rows" if rows >= 1_000_000 else f"{rows // 1000}k rows"
    lines = []
    for mode in ("publish", "raw SQL"):
        increments = [p - b for p, b in zip(peaks[mode], base, strict=True)]
        ln = Line(
            "6 memory",
            f"{label}, {mode}",
            f"{mode} peak RSS increment",
            "batch Arrow nbytes",
            increments,
            [nbytes] * len(increments),
            unit="MB",
            target=("<=", 2.0) if mode == "publish" else None,
        )
        if mode == "publish":
            ln.notes.append(
                f"fresh process per measurement; baseline peak {sorted(base)[len(base) // 2]:,.0f}"
                " MB (imports, the batch, an open connection); peak reset after building the batch"
            )
        lines.append(ln)
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", choices=MODES, required=True)
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--database", required=True)
    args = parser.parse_args()
    print(json.dumps(child(args.child, args.rows, args.database)))
