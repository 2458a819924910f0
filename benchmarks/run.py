"""Run every benchmark, print one table of medians and ratios, and write ``results.md``.

Usage: ``python -m benchmarks.run [--scale tiny|full] [--repeat N] [--only NAME,...]``. ``make
bench`` runs every benchmark at the full scale and rewrites ``benchmarks/results.md``, keeping its
sections no run writes; a run of some benchmarks, and the tiny scale (the smoke test's), write a
file only when ``--out`` is given. Nothing here asserts a time.
"""

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

from benchmarks import (
    bench_backfill,
    bench_delta,
    bench_iceberg,
    bench_materialize,
    bench_memory,
    bench_merge,
    bench_plan,
    bench_postgres,
    bench_publish,
    bench_scaling,
    bench_spark,
    bench_streams,
    breakdown,
)
from benchmarks.harness import ROOT, Line, Scale, machine, render

BENCHMARKS: dict[str, ModuleType] = {
    "publish": bench_publish,
    "materialize": bench_materialize,
    "merge": bench_merge,
    "backfill": bench_backfill,
    "scaling": bench_scaling,
    "memory": bench_memory,
    "delta": bench_delta,
    "postgres": bench_postgres,
    "iceberg": bench_iceberg,
    "spark": bench_spark,
    "plan": bench_plan,
    "streams": bench_streams,
}
RESULTS = ROOT / "benchmarks" / "results.md"

METHOD = """\
Each benchmark measures its cases interleaved in one process (A, B, then B, A, ... so neither
side always runs second), after one discarded warm-up round; the table shows medians, the ratio
of the medians, and the range of the per-round ratios (each round's A and B ran back to back).
Writes go to DuckDB files on disk under a temporary directory, on connections held across
rounds. "equal" says whether the compared writes left identical rows (DuckDB `hash` fingerprint
of the table or window, plus the merge's update/insert/delete counts). No time is asserted."""


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run(
    scale: Scale, repeat: int | None, only: Sequence[str], workdir: Path
) -> tuple[list[Line], dict[str, float], str]:
    """Run the chosen benchmarks; return their lines, seconds per benchmark and the breakdown."""
    lines: list[Line] = []
    durations: dict[str, float] = {}
    for name in only:
        _log(f"[bench] {name} ({scale}) ...")
        sub = workdir / name
        sub.mkdir()
        start = time.perf_counter()
        runner: Callable[[Scale, int | None, Path], list[Line]] = BENCHMARKS[name].run
        lines += runner(scale, repeat, sub)
        durations[name] = time.perf_counter() - start
        shutil.rmtree(sub, ignore_errors=True)
        _log(f"[bench] {name} done in {durations[name]:.1f} s")
    profile = ""
    if "publish" in only or "merge" in only:
        _log("[bench] statement breakdown ...")
        sub = workdir / "breakdown"
        sub.mkdir()
        start = time.perf_counter()
        profile = breakdown.run(scale, sub)
        durations["breakdown"] = time.perf_counter() - start
    return lines, durations, profile


def notes(lines: Sequence[Line]) -> str:
    """The lines' notes, keyed by benchmark and case."""
    out = []
    for ln in lines:
        out += [f"- **{ln.bench}, {ln.case}**: {n}" for n in ln.notes]
    return "\n".join(out)


#: Backfills through the real daemon, measured apart (`make bench-backfills`), saved as JSON.
SAVED_PHASES = (
    ("before", "backfill_phases_before.json"),
    ("after: one process per run", "backfill_phases_after.json"),
    ("now: the running total in its chunk's run", "backfill_phases_joined.json"),
)
SAVED_PARALLEL = "parallel_backfill.json"


def saved_backfills() -> str:
    """The saved daemon backfill measurements as tables: per phase, and 3 slots against 1."""
    from benchmarks import backfill_phases, parallel_backfill

    parts = [
        "## Backfills through the daemon (saved by `make bench-backfills`)",
        "",
        "Per phase, medians in seconds (docs/backfills.md explains the phases):",
    ]
    for title, name in SAVED_PHASES:
        path = ROOT / "benchmarks" / name
        if path.exists():
            parts += ["", backfill_phases.table(title, json.loads(path.read_text()))]
    path = ROOT / "benchmarks" / SAVED_PARALLEL
    if path.exists():
        parts += [
            "",
            "A one-run-per-day backfill of taxi_daily on the Postgres instance, the warehouse pool"
            " at 3 slots against 1 (`benchmarks/parallel_backfill.py`):",
            "",
            parallel_backfill.table(json.loads(path.read_text())),
        ]
    return "\n".join(parts)


#: The sections :func:`markdown` writes; every other ``## `` section of the file is kept.
GENERATED = (
    "## Results",
    "## Where publish time goes",
    "## Backfills through the daemon",
    "## Machine",
)


def kept_sections(text: str) -> str:
    """The sections of a results file no run writes: the records of benchmarks run on their own.

    Each ``## `` section whose heading is not one of :data:`GENERATED`, verbatim and in order.
    """
    sections = re.split(r"(?m)^(?=## )", text)[1:]
    kept = [part.rstrip("\n") for part in sections if not part.startswith(GENERATED)]
    return "\n\n".join(kept)


def destination(scale: Scale, only: Sequence[str], out: Path | None) -> Path | None:
    """The file a run writes: ``--out``, else results.md for every benchmark at the full scale.

    A run of some benchmarks prints its table only: written to results.md, it would replace
    the results of the others.
    """
    if out is not None:
        return out
    return RESULTS if scale == "full" and set(only) == set(BENCHMARKS) else None


def markdown(
    lines: Sequence[Line],
    facts: dict[str, str],
    durations: dict[str, float],
    profile: str,
    command: str,
    kept: str = "",
) -> str:
    """The whole results file, with ``kept``: the sections of the one it replaces no run writes."""
    machine_rows = "\n".join(f"| {k} | {v} |" for k, v in facts.items())
    timing = ", ".join(f"{k} {v:.0f} s" for k, v in durations.items())
    return f"""# idem_assets benchmarks

Produced by `{command}` on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; total
{sum(durations.values()):.0f} s ({timing}).

{METHOD}

## Results

A/B is the ratio of medians; "target" is the goal for that ratio from the benchmarks issue.

{render(lines)}

{notes(lines)}

{kept + chr(10) * 2 if kept else ""}## Where publish time goes

Statement shares measured by wrapping the connection (`benchmarks/breakdown.py`); the rest is
Python, registering the Arrow batch, and fetching results.

{profile or "(not run)"}

{saved_backfills()}

## Machine

| | |
|---|---|
{machine_rows}
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run, print the table, write the results file."""
    parser = argparse.ArgumentParser(description="idem_assets benchmarks")
    parser.add_argument("--scale", choices=["tiny", "full"], default="full")
    parser.add_argument("--repeat", type=int, default=None, help="rounds per comparison")
    parser.add_argument(
        "--only", default=",".join(BENCHMARKS), help=f"comma list of {', '.join(BENCHMARKS)}"
    )
    parser.add_argument("--out", type=Path, default=None, help="results markdown path")
    parser.add_argument("--json", type=Path, default=None, help="also write lines as JSON")
    args = parser.parse_args(argv)
    only = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in only if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    out = destination(args.scale, only, args.out)
    if out is None and args.scale == "full":
        _log(f"[bench] some benchmarks only: {RESULTS} is left as it is (--out writes a file)")

    facts = machine()
    _log("[bench] " + "; ".join(f"{k}: {v}" for k, v in facts.items()))
    with tempfile.TemporaryDirectory(prefix="idem-bench-") as tmp:
        lines, durations, profile = run(args.scale, args.repeat, only, Path(tmp))
    facts["load average (1, 5, 15 min) at end"] = ", ".join(f"{x:.2f}" for x in os.getloadavg())

    table = render(lines)
    print(table)
    print()
    print(notes(lines))
    if profile:
        print()
        print(profile)
    print(f"\ntotal {sum(durations.values()):.0f} s")
    command = "python -m benchmarks.run " + " ".join(argv if argv is not None else sys.argv[1:])
    if out is not None:
        kept = kept_sections(out.read_text()) if out.exists() else ""
        out.write_text(markdown(lines, facts, durations, profile, command.strip(), kept))
        _log(f"[bench] wrote {out}")
    if args.json is not None:
        args.json.write_text(json.dumps([ln.as_dict() for ln in lines], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
