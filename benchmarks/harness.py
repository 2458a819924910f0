"""Interleaved timing, result lines, machine facts and the results table."""

import gc
import math
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Literal

import duckdb

ROOT = Path(__file__).resolve().parents[1]
Scale = Literal["tiny", "full"]


@dataclass(frozen=True)
class Case:
    """One side of a comparison: ``run`` is timed; ``prepare`` and ``cleanup`` are not."""

    name: str
    run: Callable[[], object]
    prepare: Callable[[], None] | None = None
    cleanup: Callable[[], None] | None = None


@dataclass
class Samples:
    """Wall-clock and CPU seconds (all threads of this process) of each timed round."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)


def interleave(
    cases: Sequence[Case],
    rounds: int,
    warmup: int = 1,
    cpu_clock: Callable[[], float] = time.process_time,
) -> dict[str, Samples]:
    """Seconds per round of each case, measured in turn: A, B, then B, A, and so on.

    The order flips every round so neither side always runs right after the other's writes
    (a checkpoint, a freed buffer). ``warmup`` rounds run first and are discarded. CPU time is
    kept too: on a shared machine it moves less with other people's load than wall time does.
    ``cpu_clock`` counts it: this process's by default, or with the engine's own process.
    """
    samples = {c.name: Samples() for c in cases}
    for r in range(warmup + rounds):
        for case in cases if r % 2 == 0 else list(reversed(cases)):
            if case.prepare:
                case.prepare()
            gc.collect()
            cpu = cpu_clock()
            start = time.perf_counter()
            case.run()
            elapsed = time.perf_counter() - start
            cpu = cpu_clock() - cpu
            if case.cleanup:
                case.cleanup()
            if r >= warmup:
                samples[case.name].wall.append(elapsed)
                samples[case.name].cpu.append(cpu)
    return samples


Comparison = Literal["<=", ">="]


@dataclass
class Line:
    """One row of the results table: A against B, their medians and the ratio of medians."""

    bench: str
    case: str
    a: str
    b: str
    a_values: list[float]
    b_values: list[float]
    unit: str = "s"
    target: tuple[Comparison, float] | None = None
    equal: bool | None = None
    notes: list[str] = field(default_factory=list)
    a_cpu: list[float] = field(default_factory=list)
    b_cpu: list[float] = field(default_factory=list)

    @property
    def a_median(self) -> float:
        """Median of A."""
        return statistics.median(self.a_values)

    @property
    def b_median(self) -> float:
        """Median of B."""
        return statistics.median(self.b_values)

    @property
    def ratio(self) -> float:
        """Median of A over median of B (``nan`` when B is zero)."""
        return self.a_median / self.b_median if self.b_median else math.nan

    @property
    def cpu_ratio(self) -> float:
        """Median CPU seconds of A over B (``nan`` when not measured)."""
        if not self.a_cpu or not self.b_cpu or not statistics.median(self.b_cpu):
            return math.nan
        return statistics.median(self.a_cpu) / statistics.median(self.b_cpu)

    @property
    def round_ratios(self) -> list[float]:
        """A/B of each round (the pairs were measured next to each other)."""
        return [a / b for a, b in zip(self.a_values, self.b_values, strict=False) if b]

    @property
    def met(self) -> bool | None:
        """Whether the ratio meets the target; ``None`` without a target."""
        if self.target is None:
            return None
        op, value = self.target
        return self.ratio <= value if op == "<=" else self.ratio >= value

    def as_dict(self) -> dict[str, object]:
        """The line as plain JSON-able values."""
        return {
            "bench": self.bench,
            "case": self.case,
            "a": self.a,
            "b": self.b,
            "unit": self.unit,
            "a_values": self.a_values,
            "b_values": self.b_values,
            "a_median": self.a_median,
            "b_median": self.b_median,
            "ratio": self.ratio,
            "a_cpu": self.a_cpu,
            "b_cpu": self.b_cpu,
            "cpu_ratio": self.cpu_ratio,
            "target": list(self.target) if self.target else None,
            "met": self.met,
            "equal": self.equal,
            "notes": self.notes,
        }


def line_from_times(
    bench: str,
    case: str,
    times: dict[str, Samples],
    a: str,
    b: str,
    **kwargs: object,
) -> Line:
    """A line comparing two cases of one :func:`interleave` call."""
    return Line(
        bench,
        case,
        a,
        b,
        times[a].wall,
        times[b].wall,
        a_cpu=times[a].cpu,
        b_cpu=times[b].cpu,
        **kwargs,  # type: ignore[arg-type]
    )


def _fmt(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1000:,.0f} ms" if value < 10 else f"{value:,.1f} s"
    return f"{value:,.1f} {unit}"


def render(lines: Sequence[Line]) -> str:
    """The results as one markdown table."""
    head = (
        "| # | benchmark | A vs B | median A | median B | A/B | per-round A/B | A/B CPU | target"
        " | met | equal | n |"
    )
    out = [head, "|---|---|---|--:|--:|--:|--:|--:|---|---|---|--:|"]
    for ln in lines:
        rr = ln.round_ratios
        spread = f"{min(rr):.2f}-{max(rr):.2f}" if rr else "-"
        target = f"{ln.target[0]} {ln.target[1]:g}x" if ln.target else "-"
        met = {True: "yes", False: "**no**", None: "-"}[ln.met]
        equal = {True: "yes", False: "**NO**", None: "-"}[ln.equal]
        cpu = "-" if math.isnan(ln.cpu_ratio) else f"{ln.cpu_ratio:.2f}x"
        out.append(
            f"| {ln.bench} | {ln.case} | {ln.a} vs {ln.b} | {_fmt(ln.a_median, ln.unit)}"
            f" | {_fmt(ln.b_median, ln.unit)} | {ln.ratio:.2f}x | {spread} | {cpu} | {target}"
            f" | {met} | {equal} | {len(ln.a_values)} |"
        )
    return "\n".join(out)


def _cpu_model() -> str:
    try:
        for row in Path("/proc/cpuinfo").read_text().splitlines():
            if row.startswith("model name"):
                return row.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gb() -> str:
    try:
        for row in Path("/proc/meminfo").read_text().splitlines():
            if row.startswith("MemTotal"):
                return f"{int(row.split()[1]) / 1024 / 1024:.1f} GB"
    except OSError:
        pass
    return "unknown"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
        commit = out.stdout.strip()
        # Read-only: exit status 1 means idem_assets/ differs from the commit.
        dirty = subprocess.run(
            ["git", "diff", "--quiet", "HEAD", "--", "idem_assets"], cwd=ROOT, timeout=10
        ).returncode
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + (" + uncommitted changes in idem_assets/" if dirty else "")


def machine() -> dict[str, str]:
    """Facts that make a result reproducible: CPU, memory, load, Python and package versions."""
    threads = duckdb.connect().sql("SELECT current_setting('threads')").fetchall()[0][0]
    facts = {
        "nproc": str(os.cpu_count()),
        "CPU": _cpu_model(),
        "memory": _memory_gb(),
        "load average (1, 5, 15 min) at start": ", ".join(f"{x:.2f}" for x in os.getloadavg()),
        "OS": platform.platform(),
        "Python": platform.python_version(),
        "DuckDB threads": str(threads),
        "idem_assets commit": _commit(),
    }
    for dist in (
        "duckdb",
        "pyarrow",
        "pandas",
        "numpy",
        "dagster",
        "dagster-duckdb",
        "dagster-duckdb-pandas",
        "deltalake",
        "adbc-driver-postgresql",
    ):
        facts[dist] = _version(dist)
    return facts
