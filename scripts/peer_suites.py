"""Dagster's own IO manager test suites, run against the peers and with ours swapped in.

For each peer (dagster-duckdb-pandas, dagster-deltalake, dagster-deltalake-pandas) this fetches
the source distribution of the version installed here with pip, extracts its ``*_tests``
package twice and runs it with pytest: once as published (the baseline, against the peer's own
IO manager) and once with the peer's IO manager replaced by ours through exact string
replacements (the test bodies are unchanged). A module none of whose text the swap changes does
not construct an IO manager and is not run swapped. Prints passed/failed per suite and each
swapped failure's first error line.

    .venv/bin/python scripts/peer_suites.py [--min-swapped 31] [--work DIR]
"""

import argparse
import importlib.metadata
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Suite:
    """One peer's test package and how our IO manager takes its IO manager's place."""

    distribution: str
    package: str
    #: Exact replacements, in order; each must occur at least once in the package.
    swaps: tuple[tuple[str, str], ...]
    #: Tests that construct no IO manager (they call a peer's helper directly): not run swapped.
    no_io_manager: tuple[str, ...] = ()


SUITES = (
    Suite(
        "dagster-duckdb-pandas",
        "dagster_duckdb_pandas_tests",
        (
            ("DuckDBPandasIOManager(", "ia.DuckDBOverwriteIOManager("),
            # The legacy function's .configured({...}) takes the same fields as a dict.
            ("duckdb_pandas_io_manager.configured(", "ia.DuckDBOverwriteIOManager(**"),
        ),
        no_io_manager=("test_handle_output_empty_dataframe",),
    ),
    Suite(
        "dagster-deltalake",
        "dagster_deltalake_tests",
        (("DeltaLakePyarrowIOManager(", "ia.DeltaOverwriteIOManager("),),
    ),
    Suite(
        "dagster-deltalake-pandas",
        "dagster_deltalake_pandas_tests",
        (("DeltaLakePandasIOManager(", "ia.DeltaOverwriteIOManager("),),
    ),
)

IMPORT = "import idem_assets as ia\n"


@dataclass
class Outcome:
    """What one pytest run of a suite gave."""

    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    @property
    def ran(self) -> int:
        """Tests that ran (skipped ones do not count)."""
        return len(self.passed) + len(self.failed)


def fetch(suite: Suite, downloads: Path) -> Path:
    """The installed version's source distribution, downloaded with pip (kept in ``downloads``)."""
    version = importlib.metadata.version(suite.distribution)
    stem = f"{suite.distribution.replace('-', '_')}-{version}"
    found = sorted(downloads.glob(f"{stem}.tar.gz"))
    if not found:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--dest",
                str(downloads),
                f"{suite.distribution}=={version}",
            ],
            check=True,
        )
        found = sorted(downloads.glob(f"{stem}.tar.gz"))
    if not found:
        raise SystemExit(f"pip downloaded no {stem}.tar.gz into {downloads}")
    return found[0]


def extract(sdist: Path, suite: Suite, into: Path) -> Path:
    """The suite's test package, extracted afresh under ``into``."""
    shutil.rmtree(into, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if f"/{suite.package}/" in f"/{m.name}"]
        tar.extractall(into, members=members, filter="data")
    found = next(into.rglob(suite.package))
    target = into / suite.package
    found.rename(target)
    return target


def swap(package: Path, suite: Suite) -> list[Path]:
    """Apply the suite's replacements to each module; the modules they changed."""
    used = dict.fromkeys((old for old, _ in suite.swaps), 0)
    changed = []
    for module in sorted(package.glob("test_*.py")):
        text = module.read_text()
        new = text
        for old, replacement in suite.swaps:
            used[old] += new.count(old)
            new = new.replace(old, replacement)
        if new != text:
            module.write_text(IMPORT + new)
            changed.append(module)
    unused = [old for old, count in used.items() if not count]
    if unused:
        raise SystemExit(f"{suite.package}: no occurrence of {unused}; the peer's tests changed")
    return changed


def run(package: Path, modules: list[Path], deselect: tuple[str, ...]) -> Outcome:
    """Run the modules with pytest (outside this repository's configuration)."""
    report = package.parent / f"{package.name}.xml"
    ini = package.parent / "pytest.ini"
    ini.write_text("[pytest]\n")
    command = [
        sys.executable,
        "-m",
        "pytest",
        *(str(m.relative_to(package.parent)) for m in modules),
        "-q",
        "-p",
        "no:cacheprovider",
        "-c",
        str(ini),
        "--rootdir",
        str(package.parent),
        f"--junitxml={report}",
    ]
    for name in deselect:
        for m in modules:
            command += ["--deselect", f"{m.relative_to(package.parent)}::{name}"]
    subprocess.run(command, cwd=package.parent, capture_output=True, check=False)
    return parse(report)


def parse(report: Path) -> Outcome:
    """Passed, failed (with the first line of the error) and skipped tests of a JUnit report."""
    outcome = Outcome()
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if case.find("skipped") is not None:
            outcome.skipped.append(name)
        elif problem is not None:
            outcome.failed[name] = (problem.get("message") or "").strip().splitlines()[0][:300]
        else:
            outcome.passed.append(name)
    return outcome


def main() -> int:
    """Run every suite both ways, print the counts, and fail below ``--min-swapped``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-swapped", type=int, default=0, help="fail below this many passes")
    parser.add_argument("--work", type=Path, default=None, help="where to download and extract")
    parser.add_argument("--only", nargs="*", default=None, help="these test packages only")
    parser.add_argument("--no-baseline", action="store_true", help="skip the peers' own runs")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="peer-suites-"))
    downloads = work / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)

    rows = []
    baseline_failed = 0
    swapped_passed = swapped_ran = 0
    for suite in SUITES:
        if args.only is not None and suite.package not in args.only:
            continue
        sdist = fetch(suite, downloads)
        base = Outcome()
        if not args.no_baseline:
            base_pkg = extract(sdist, suite, work / "baseline" / suite.package)
            base = run(base_pkg, sorted(base_pkg.glob("test_*.py")), ())
        ours_pkg = extract(sdist, suite, work / "swapped" / suite.package)
        ours = run(ours_pkg, swap(ours_pkg, suite), suite.no_io_manager)
        rows.append((suite, base, ours))
        baseline_failed += len(base.failed)
        swapped_passed += len(ours.passed)
        swapped_ran += ours.ran

    print(f"{'suite':34} {'swapped (ours)':>16} {'baseline (peer)':>16}")
    for suite, base, ours in rows:
        version = importlib.metadata.version(suite.distribution)
        print(
            f"{suite.package + ' ' + version:34} {len(ours.passed):>7} of {ours.ran:<6}"
            f" {len(base.passed):>7} of {base.ran:<6}"
        )
    base_passed = sum(len(base.passed) for _, base, _ in rows)
    base_ran = sum(base.ran for _, base, _ in rows)
    print(f"{'total':34} {swapped_passed:>7} of {swapped_ran:<6} {base_passed:>7} of {base_ran:<6}")
    for suite, base, ours in rows:
        for name, message in ours.failed.items():
            print(f"swapped FAILED {suite.package}/{name}: {message}")
        for name, message in base.failed.items():
            print(f"baseline FAILED {suite.package}/{name}: {message}")
    if baseline_failed:
        print(f"{baseline_failed} baseline test(s) failed against the peers' own IO managers")
        return 1
    if swapped_passed < args.min_swapped:
        print(f"{swapped_passed} swapped tests passed, fewer than --min-swapped {args.min_swapped}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
