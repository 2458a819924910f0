"""What a run worker pays to load the code: ``import idem_assets`` against ``import dagster``.

Each import runs in a fresh interpreter, the kinds interleaved so a busy moment of a shared
machine falls on all of them alike; medians and ratios are printed with the load average.
Give ``--before PYTHON`` (another checkout's virtualenv) to set it side by side with this one.

    .venv/bin/python -m benchmarks.import_time --repeat 7
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: What each measurement imports in a fresh interpreter.
IMPORTS = {
    "dagster": "import dagster",
    "idem_assets": "import idem_assets",
    "code location": "import idem_assets.definitions",
}
#: Modules of the engines that are extras; the core import must load none of them.
DRIVERS = [
    "deltalake",
    "adbc_driver_postgresql",
    "psycopg2",
    "dagster_postgres",
    "dagster_webserver",
]


def checkout(python: str) -> Path:
    """The checkout whose ``.venv`` holds ``python``: it runs there, importing its own code."""
    return Path(python).absolute().parents[2]


def timed(python: str, statement: str) -> float:
    """Seconds ``python`` takes to start, run ``statement`` and exit."""
    start = time.perf_counter()
    subprocess.run([python, "-c", statement], check=True, capture_output=True, cwd=checkout(python))
    return time.perf_counter() - start


def drivers_loaded(python: str) -> list[str]:
    """The engine drivers ``import idem_assets, idem_assets.definitions`` loads."""
    code = (
        "import sys, idem_assets, idem_assets.definitions;"
        f" print(','.join(m for m in {DRIVERS!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [python, "-c", code], check=True, capture_output=True, text=True, cwd=checkout(python)
    )
    return [m for m in out.stdout.strip().split(",") if m]


def main() -> None:
    """Print the medians of every import, for this checkout and ``--before``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--before", help="the python of another checkout to compare with")
    args = parser.parse_args()
    pythons = {"now": sys.executable}
    if args.before:
        pythons["before"] = args.before
    samples: dict[tuple[str, str], list[float]] = {}
    loads = [os.getloadavg()[0]]
    for python in pythons.values():
        timed(python, "import idem_assets.definitions")  # warm the file cache once
    for _ in range(args.repeat):
        for label, python in pythons.items():
            for name, statement in IMPORTS.items():
                samples.setdefault((label, name), []).append(timed(python, statement))
        loads.append(os.getloadavg()[0])
    print(f"load average (1 min) during the run: {min(loads):.2f}-{max(loads):.2f}")
    for label, python in pythons.items():
        base = statistics.median(samples[(label, "dagster")])
        print(f"{label}: engine drivers loaded by the import: {drivers_loaded(python) or 'none'}")
        for name in IMPORTS:
            median = statistics.median(samples[(label, name)])
            print(f"  {name:<14} {median:6.2f} s  {median / base:4.2f}x import dagster")
    if args.before:
        for name in IMPORTS:
            ratio = statistics.median(samples[("now", name)]) / statistics.median(
                samples[("before", name)]
            )
            print(f"now / before, {name:<14} {ratio:4.2f}x")


if __name__ == "__main__":
    main()
