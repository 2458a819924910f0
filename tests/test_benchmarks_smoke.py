"""Every benchmark runs at the tiny scale, so `make bench` cannot rot. No time is asserted."""

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = [
    "publish",
    "materialize",
    "merge",
    "backfill",
    "scaling",
    "memory",
    "delta",
    "postgres",
    "iceberg",
    "spark",
    "plan",
    "streams",
]


def tiny(*args: str, timeout: int) -> subprocess.CompletedProcess[str]:
    """``benchmarks.run`` at the tiny scale, one round, from the repository root; it must pass.

    A subprocess from the root: `benchmarks` is not an installed package.
    """
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--scale", "tiny", "--repeat", "1", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench")
    # A deadline, not a speed target: the twelve benchmarks took 558 s of a loaded CI run.
    proc = tiny("--out", str(out / "results.md"), "--json", str(out / "lines.json"), timeout=1500)
    return {
        "lines": json.loads((out / "lines.json").read_text()),
        "markdown": (out / "results.md").read_text(),
        "stdout": proc.stdout,
    }


@pytest.mark.parametrize("bench", BENCHMARKS)
def test_benchmark_produces_finite_ratios_and_equal_results(
    tiny_run: dict[str, Any], bench: str
) -> None:
    number = BENCHMARKS.index(bench) + 1
    lines = [ln for ln in tiny_run["lines"] if ln["bench"].startswith(f"{number} ")]
    assert lines, f"benchmark {bench} produced no result line"
    for ln in lines:
        assert math.isfinite(ln["ratio"]) and ln["ratio"] > 0, ln
        assert ln["a_values"] and ln["b_values"], ln
        # Where a benchmark compares written rows, ours and the baseline must be identical.
        assert ln["equal"] in (True, None), ln


def test_results_file_holds_table_and_machine(tiny_run: dict[str, Any]) -> None:
    md = tiny_run["markdown"]
    assert "| # | benchmark | A vs B |" in md
    assert "| nproc |" in md and "| duckdb |" in md
    assert "## Where publish time goes" in md
    assert "| # | benchmark |" in tiny_run["stdout"]


def test_the_import_benchmark_runs_as_its_docstring_prints_and_finds_no_driver() -> None:
    from benchmarks import import_time

    printed = [line.strip() for line in (import_time.__doc__ or "").splitlines()]
    command = next(line for line in printed if line.startswith(".venv/bin/python"))
    # As printed, with one repetition instead of seven so the suite stays quick.
    argv = command.replace("--repeat 7", "--repeat 1").split()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "now: engine drivers loaded by the import: none" in proc.stdout
    assert "x import dagster" in proc.stdout


def test_a_run_of_one_benchmark_keeps_the_sections_run_on_their_own(tmp_path: Path) -> None:
    """Written over a results file, a run replaces its tables and keeps every other section."""
    from benchmarks import run

    recorded = (ROOT / "benchmarks" / "results.md").read_text()
    out = tmp_path / "results.md"
    out.write_text(recorded)
    tiny("--only", "plan", "--out", str(out), timeout=300)
    written = out.read_text()
    kept = run.kept_sections(recorded)
    assert "## Spark (benchmark 10, run on its own)" in kept
    assert kept in written
    assert "Produced by `python -m benchmarks.run --scale tiny --repeat 1 --only plan" in written
    assert written.count("## Results") == written.count("## Machine") == 1


def test_only_a_run_of_every_benchmark_at_full_scale_writes_results_md() -> None:
    from benchmarks import run

    every = list(run.BENCHMARKS)
    assert run.destination("full", every, None) == run.RESULTS
    assert run.destination("full", ["streams"], None) is None
    assert run.destination("tiny", every, None) is None
    assert run.destination("full", ["streams"], Path("x.md")) == Path("x.md")
