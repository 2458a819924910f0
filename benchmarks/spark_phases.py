"""Where a Spark publish spends its time: seconds and Spark jobs per phase, beside raw Spark.

Usage: ``python -m benchmarks.spark_phases [--rows N] [--rounds N]``. It builds benchmark 10's
table (:mod:`benchmarks.bench_spark`), then times our overwrite and merge of one day, phase by
phase (each phase's time includes the phases indented under it), and raw Spark's. The load
average is printed with the table: on a busy machine, compare phases within one run only.
"""

import argparse
import os
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks import bench_spark, data


class Phases:
    """Wall seconds and Spark jobs of named calls, nested as they ran."""

    def __init__(self, spark: Any) -> None:
        """Count jobs through ``spark``'s status tracker."""
        self.tracker = spark.sparkContext.statusTracker()
        self.stack: list[str] = []
        self.seconds: dict[str, list[float]] = defaultdict(list)
        self.jobs: dict[str, list[int]] = defaultdict(list)
        self.order: list[str] = []
        self._undo: list[Callable[[], None]] = []

    def count(self) -> int:
        """Jobs the session has started so far (outside any job group)."""
        return len(self.tracker.getJobIdsForGroup())

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the body as ``name``, nested under the phase that is running."""
        path = " > ".join([*self.stack, name])
        if path not in self.order:
            self.order.append(path)
        self.stack.append(name)
        jobs, start = self.count(), time.perf_counter()
        try:
            yield
        finally:
            self.seconds[path].append(time.perf_counter() - start)
            self.jobs[path].append(self.count() - jobs)
            self.stack.pop()

    def wrap(
        self,
        owner: Any,
        attribute: str,
        name: str | None = None,
        label: Callable[..., str] | None = None,
    ) -> None:
        """Time every call of ``owner.attribute`` as a phase (named by ``label`` of its args)."""
        original = getattr(owner, attribute)

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.phase(label(*args, **kwargs) if label else name or attribute):
                return original(*args, **kwargs)

        setattr(owner, attribute, timed)
        self._undo.append(lambda: setattr(owner, attribute, original))

    def reset(self) -> None:
        """Forget what was measured (the warm-up round's)."""
        self.seconds.clear()
        self.jobs.clear()
        self.order.clear()

    def table(self, rounds: int) -> str:
        """Median seconds and jobs per round of each phase, as a markdown table."""
        lines = ["| phase | calls/round | median s/round | jobs/round |", "|---|--:|--:|--:|"]
        for path in self.order:
            depth = path.count(" > ")
            name = "&nbsp;&nbsp;" * depth + path.split(" > ")[-1]
            calls = len(self.seconds[path]) // rounds
            per_round = _per_round(self.seconds[path], rounds)
            jobs = sum(self.jobs[path]) / rounds
            lines.append(f"| {name} | {calls} | {per_round:.2f} | {jobs:g} |")
        return "\n".join(lines)


def _per_round(values: Sequence[float], rounds: int) -> float:
    """The median over rounds of a phase's summed seconds (calls split evenly by round)."""
    calls = max(len(values) // rounds, 1)
    sums = [sum(values[i * calls : (i + 1) * calls]) for i in range(rounds)]
    return statistics.median(sums)


def _statement(session: Any, query: str, *args: Any, **kwargs: Any) -> str:
    """A statement's phase name: its first words (the metastore's calls are SQL statements)."""
    words = query.split()
    return "sql: " + " ".join(words[:2] if words[0] == "SELECT" else words[:4])


def instrument(phases: Phases) -> None:
    """Wrap the calls of a Spark publish that matter, and the guards' in the neutral core."""
    from pyspark.sql.catalog import Catalog
    from pyspark.sql.classic.dataframe import DataFrame
    from pyspark.sql.session import SparkSession

    from idem_assets.lib.backends.spark import backend, catalog
    from idem_assets.lib.write import fitting, guards, publish

    phases.wrap(DataFrame, "localCheckpoint", "checkpoint")
    phases.wrap(backend.SparkBackend, "evaluate", "evaluate (+ probe)")
    phases.wrap(backend, "spark_batch", "write as sent, observed")
    phases.wrap(SparkSession, "sql", label=_statement)
    phases.wrap(Catalog, "refreshTable", "catalog: refreshTable")
    phases.wrap(publish, "judge")
    phases.wrap(backend.SparkBackend, "table", "catalog: read table")
    tx = backend.SparkTransaction
    for name in (
        "describe",
        "stage",
        "summarize",
        "write",
        "commit",
        "_write",
        "_fingerprints",
        "_footer_counts",
        "_write_kept",
    ):
        phases.wrap(tx, name)
    phases.wrap(fitting, "fit")
    phases.wrap(guards, "profile", "guards: profile")
    phases.wrap(publish, "check_runtime_values")
    phases.wrap(backend, "table_lock", "lock")
    names = ("partitions", "written_partitions", "move_partitions", "remove", "advance")
    more = ("add_partitions", "drop_partition", "table_exists")
    for name in (*names, *more, "row_count", "move_files", "partition_created"):
        phases.wrap(catalog, name, f"catalog: {name}")


def main(argv: Sequence[str] | None = None) -> int:
    """Build the table, then measure ours and raw Spark per phase."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000, help="rows of the written day")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds after a warm-up")
    args = parser.parse_args(argv)
    import idem_assets as ia
    from idem_assets.lib.backends.spark.backend import SparkBackend

    rows, day = args.rows, bench_spark.OTHER_DAYS
    with tempfile.TemporaryDirectory(prefix="idem-spark-phases-") as tmp:
        workdir = Path(tmp)
        spark = bench_spark._session(workdir)
        spark.sql(f"CREATE DATABASE bench LOCATION '{workdir.resolve() / 'bench.db'}'")
        backend = SparkBackend(spark)
        tables = bench_spark.build_tables(spark, backend, rows)
        phases = Phases(spark)
        instrument(phases)

        def ours(mode: str, table: str, version: int) -> None:
            settings = bench_spark.settings(mode, table)
            frame = bench_spark.day_frame(spark, day, rows, version)
            batch = backend.evaluate(frame, settings)
            ia.publish(backend, batch, settings, data.window([day]), now=data.NOW)

        cases: list[tuple[str, Callable[[], None]]] = [
            ("ours: overwrite", lambda: ours("overwrite", "ours", 1)),
            ("raw: insertInto, dynamic", lambda: bench_spark.raw_overwrite(tables, rows)),
            ("ours: merge", lambda: ours("merge", "ours_merge", 2)),
            ("raw: DataFrame merge", lambda: bench_spark.raw_merge(tables, rows)),
        ]
        for r in range(1 + args.rounds):
            if r == 1:
                phases.reset()
            for name, case in cases if r % 2 else reversed(cases):
                with phases.phase(name):
                    case()
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"{rows:,} rows, {args.rounds} rounds; load average at the end: {load}\n")
        print(phases.table(args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
