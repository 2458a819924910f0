"""Data-quality checks that run on the staged batch before it is published.

Each check compiles to SQL aggregates. All of an asset's checks are evaluated together in one
scan of the batch, grouped by partition, so a chunked backfill still gets a verdict per day, and
a run of static keys or (day, region) cells a verdict per key or cell. Freshness is measured
against the end of each partition's time window, never against the wall clock.
"""

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from typing import Any, ClassVar, Literal

import dagster as dg
import duckdb

from idem_assets.lib.model.identifiers import quote, validate_identifier
from idem_assets.lib.model.samples import sample_records
from idem_assets.lib.model.windows import PartitionWindow, WriteWindow, region_for
from idem_assets.lib.sql import statements as batch_sql

#: Expected rows for a partition key (e.g. read from the file's manifest).
ExpectedRows = int | Mapping[str, int] | Callable[[str], int]

#: Name of the always-on check that every row lies inside the run's window.
IN_WINDOW_CHECK = "in_window"


#: What a check's failing count counts: rows of one day, whole partitions, or rows of the batch
#: that belong to no day of the window.
Unit = Literal["row", "partition", "batch"]


@dataclass(frozen=True)
class SampleScope:
    """Where to look for a failing check's sample rows: the staged relation, maybe one partition."""

    con: duckdb.DuckDBPyConnection
    relation: str
    per_partition: Mapping[str, Any]
    #: The partition whose rows ``relation`` holds; ``None``: the whole batch.
    day: str | None = None
    #: ``(dimension, column)`` of each partition column (see :func:`~windows.as_pairs`).
    partition_columns: tuple[tuple[str, str], ...] = ()
    window: WriteWindow | None = None
    limit: int = 5

    def rows(self, condition: str = "TRUE", order_by: str = "") -> list[dict[str, Any]]:
        """Rows of the scope meeting ``condition``, in ``order_by`` order."""
        order = f" ORDER BY {order_by}" if order_by else ""
        return sample_records(
            self.con,
            f"SELECT * FROM {quote(self.relation)} WHERE {condition}{order}"
            f" LIMIT {int(self.limit)}",
        )


@dataclass(frozen=True)
class Check:
    """One data-quality rule. Build them with the functions below, not directly.

    Each kind of check is a subclass saying what it aggregates per partition, how it judges a
    partition from that aggregate, and which rows it shows when it fails.
    """

    name: str
    description: str
    columns: tuple[str, ...] = ()
    low: float | None = None
    high: float | None = None
    max_lag: timedelta | None = None
    expected: ExpectedRows | None = field(default=None, compare=False)
    blocking: bool = True

    kind: ClassVar[str] = ""
    unit: ClassVar[Unit] = "row"

    def spec(
        self, asset_key: dg.AssetKey, partitions_def: dg.PartitionsDefinition | None = None
    ) -> dg.AssetCheckSpec:
        """The Dagster check spec, partitioned like its asset so each day gets its own verdict.

        Blocking checks stop downstream assets when they fail. ``partitions_def`` on a check is
        a Dagster preview API; docs/preview-apis.md names the fallback.
        """
        return dg.AssetCheckSpec(
            name=self.name,
            asset=asset_key,
            blocking=self.blocking,
            description=self.description,
            partitions_def=partitions_def,
        )

    @property
    def severity(self) -> dg.AssetCheckSeverity:
        """ERROR for blocking checks, WARN for the others."""
        return dg.AssetCheckSeverity.ERROR if self.blocking else dg.AssetCheckSeverity.WARN

    def failing_predicate(self) -> str | None:
        """SQL predicate selecting a failing row, where a row can fail on its own."""
        return None

    def aggregate(self) -> str:
        """The SQL aggregate this check needs per partition group."""
        pred = self.failing_predicate()
        return f"count(*) FILTER (WHERE {pred})" if pred else "NULL"

    def judge_partition(
        self, window: PartitionWindow, rows: int, value: Any
    ) -> tuple[bool, dict[str, Any], int]:
        """``(passed, what was measured, failing units)`` of one partition."""
        failing = int(value or 0)
        return failing == 0, {"failing": failing}, failing

    def sample(self, scope: SampleScope) -> list[dict[str, Any]]:
        """The rows (or partitions) to show when the check fails."""
        pred = self.failing_predicate()
        return scope.rows(pred) if pred else []


@dataclass(frozen=True)
class RowCount(Check):
    """Rows per partition equal the expected count or lie within bounds."""

    kind: ClassVar[str] = "row_count"
    unit: ClassVar[Unit] = "partition"

    def judge_partition(
        self, window: PartitionWindow, rows: int, value: Any
    ) -> tuple[bool, dict[str, Any], int]:
        """Compare the partition's rows with the declared count or bounds."""
        exp = expected_for(self, window.key)
        declared_nothing = exp is None and self.low is None and self.high is None
        ok = (
            not declared_nothing
            and (exp is None or rows == exp)
            and (self.low is None or rows >= self.low)
            and (self.high is None or rows <= self.high)
        )
        measured = {"rows": rows, "expected": exp, "delta": None if exp is None else rows - exp}
        return ok, measured, 0 if ok else 1

    def sample(self, scope: SampleScope) -> list[dict[str, Any]]:
        """No row is wrong on its own: show the partitions whose count is off."""
        if scope.day is not None:
            return [{"partition": scope.day, **scope.per_partition.get(scope.day, {})}]
        return [
            {"partition": key, **detail}
            for key, detail in scope.per_partition.items()
            if detail["delta"] != 0
        ][: scope.limit]


@dataclass(frozen=True)
class NotNull(Check):
    """No NULL in any of the columns."""

    kind: ClassVar[str] = "not_null"

    def failing_predicate(self) -> str | None:
        """Any of the columns is NULL."""
        return " OR ".join(f"{quote(x)} IS NULL" for x in self.columns)


@dataclass(frozen=True)
class Between(Check):
    """Every non-NULL value lies in ``[low, high]``."""

    kind: ClassVar[str] = "between"

    def failing_predicate(self) -> str | None:
        """Below, above, or not a number."""
        c = quote(self.columns[0])
        # NaN sorts above every number in DuckDB, so NaN and infinities fail the range too.
        low, high = _double(self.low), _double(self.high)
        return f"({c} < {low} OR {c} > {high} OR isnan({c}::DOUBLE))"


@dataclass(frozen=True)
class Unique(Check):
    """No two rows of the batch share the columns."""

    kind: ClassVar[str] = "unique"

    def aggregate(self) -> str:
        """Rows beyond the first of each key."""
        cols = [quote(x) for x in self.columns]
        expr = cols[0] if len(cols) == 1 else f"row({', '.join(cols)})"
        return f"count(*) - count(DISTINCT {expr})"

    def sample(self, scope: SampleScope) -> list[dict[str, Any]]:
        """The rows of the first few repeated keys, within the scope."""
        query, params = batch_sql.duplicate_key_sample(scope.relation, self.columns, scope.limit)
        return sample_records(scope.con, query, params)


@dataclass(frozen=True)
class Freshness(Check):
    """The newest value of each partition lies within ``max_lag`` of its end."""

    kind: ClassVar[str] = "freshness"
    unit: ClassVar[Unit] = "partition"

    def aggregate(self) -> str:
        """The newest value."""
        return f"max({quote(self.columns[0])})"

    def judge_partition(
        self, window: PartitionWindow, rows: int, value: Any
    ) -> tuple[bool, dict[str, Any], int]:
        """Measure the newest value's lag behind the end of the partition."""
        # audit_table refuses freshness on partitions with no time window.
        assert self.max_lag is not None and window.end is not None
        lag = freshness_lag(window.end, value)
        ok = lag is not None and lag <= self.max_lag
        return ok, {"newest": str(value), "lag": str(lag)}, 0 if ok else 1

    def sample(self, scope: SampleScope) -> list[dict[str, Any]]:
        """The newest rows, to compare with the end of the window."""
        return scope.rows(order_by=f"{quote(self.columns[0])} DESC NULLS LAST")


@dataclass(frozen=True)
class InWindow(Check):
    """Every row lies inside the run's window."""

    kind: ClassVar[str] = "in_window"
    unit: ClassVar[Unit] = "batch"

    def judge_partition(
        self, window: PartitionWindow, rows: int, value: Any
    ) -> tuple[bool, dict[str, Any], int]:
        """A row inside a partition is in the window by definition; strays have no partition."""
        return True, {"rows": rows}, 0

    def sample(self, scope: SampleScope) -> list[dict[str, Any]]:
        """Rows outside the window (a partition on its own holds none)."""
        if scope.day is not None or not scope.partition_columns or scope.window is None:
            return []
        schema = (
            scope.con.sql(f"SELECT * FROM {quote(scope.relation)} LIMIT 0").to_arrow_table().schema
        )
        columns = [c for _, c in scope.partition_columns]
        region = region_for(
            scope.window, scope.partition_columns, {c: schema.field(c).type for c in columns}
        )
        q, p = batch_sql.stray_rows_sample(scope.relation, columns, region)
        return sample_records(scope.con, q, p)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _check_name(name: str) -> str:
    # Dagster names allow only ASCII letters, digits and underscores; columns may be in any script.
    return re.sub(r"[^A-Za-z0-9_]", "_", name.replace("-", "minus_"))


def _double(value: float | None) -> str:
    # Through float() and a quoted cast, so numpy scalars and infinities are valid SQL literals.
    return f"'{float(value if value is not None else 'nan')!r}'::DOUBLE"


def _cols(columns: Sequence[str]) -> tuple[str, ...]:
    return tuple(validate_identifier(c, "check column") for c in columns)


def row_count(
    expected: ExpectedRows | None = None,
    *,
    min_rows: int | None = None,
    max_rows: int | None = None,
    name: str = "row_count",
    blocking: bool = True,
) -> Check:
    """Rows per partition equal ``expected`` or lie within ``[min_rows, max_rows]``.

    ``expected`` is an int, a mapping of partition key to count, or a callable of the key. With
    no argument, the count comes from the asset's ``Batch(data, expected_rows={key: n})``, and a
    partition without one fails: a count nobody declared cannot be checked.
    """
    if expected is None and min_rows is None and max_rows is None:
        desc = "Rows per partition equal the count the asset declares with Batch(expected_rows=...)"
    elif expected is not None:
        desc = "Rows per partition equal the expected count"
    else:
        desc = f"Rows per partition within [{min_rows}, {max_rows}]"
    return RowCount(
        name=name,
        description=desc,
        low=min_rows,
        high=max_rows,
        expected=expected,
        blocking=blocking,
    )


def not_null(*columns: str, name: str | None = None, blocking: bool = True) -> Check:
    """No NULL in any of ``columns``."""
    cols = _cols(columns)
    return NotNull(
        name=name or _check_name(f"{'_'.join(cols)}_not_null"),
        description=f"No NULL in {', '.join(cols)}",
        columns=cols,
        blocking=blocking,
    )


def unique(*columns: str, name: str | None = None, blocking: bool = True) -> Check:
    """No two rows of the batch share ``columns``."""
    cols = _cols(columns)
    return Unique(
        name=name or _check_name(f"{'_'.join(cols)}_unique"),
        description=f"No duplicate ({', '.join(cols)}) in the batch",
        columns=cols,
        blocking=blocking,
    )


def between(
    column: str, low: float, high: float, *, name: str | None = None, blocking: bool = True
) -> Check:
    """Every non-NULL value of ``column`` lies in ``[low, high]``; NaN and infinities fail."""
    (col,) = _cols([column])
    return Between(
        name=name or _check_name(f"{col}_between_{_num(low)}_and_{_num(high)}"),
        description=f"{col} between {low:g} and {high:g}",
        columns=(col,),
        low=low,
        high=high,
        blocking=blocking,
    )


def freshness(
    column: str, max_lag: timedelta, *, name: str | None = None, blocking: bool = True
) -> Check:
    """The newest ``column`` value of each partition lies within ``max_lag`` of its end.

    On a DATE column a date counts as the end of its day (see :func:`freshness_lag`).
    """
    (col,) = _cols([column])
    return Freshness(
        name=name or _check_name(f"{col}_freshness"),
        description=f"Newest {col} within {max_lag} of the end of its partition",
        columns=(col,),
        max_lag=max_lag,
        blocking=blocking,
    )


def in_window(*columns: str) -> Check:
    """Every row's partition ``columns`` lie inside the run's partitions (always on for them)."""
    cols = _cols(columns)
    what = cols[0] if len(cols) == 1 else f"({', '.join(cols)})"
    return InWindow(
        name=IN_WINDOW_CHECK,
        description=f"Every {what} inside the run's partition window",
        columns=cols,
    )


def expected_for(check: Check, key: str) -> int | None:
    """The expected row count of one partition, or ``None`` when the check uses bounds."""
    exp = check.expected
    if exp is None:
        return None
    if isinstance(exp, int):
        return exp
    if isinstance(exp, Mapping):
        return exp.get(key)
    return exp(key)


def aggregate_sql(checks: Sequence[Check]) -> list[str]:
    """The SQL aggregates every check needs, in order; evaluated per partition group."""
    return ["count(*)", *(c.aggregate() for c in checks)]


def freshness_lag(end: datetime, newest: date | datetime | None) -> timedelta | None:
    """How long before the window's ``end`` the newest value lies; ``None`` when there is none.

    A DATE says only which day, so a date counts as the end of its day: the newest day of a
    window is fresh, and a ``max_lag`` below one day fails every earlier day. A naive timestamp
    is wall-clock time in the partitions' timezone, so it is compared with the end's wall clock.
    """
    if newest is None:
        return None
    if not isinstance(newest, datetime):
        return end - datetime.combine(newest + timedelta(days=1), time(), tzinfo=end.tzinfo)
    if newest.tzinfo is None:
        return end.replace(tzinfo=None) - newest
    return end - newest


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check over the run's partitions."""

    check: Check
    passed: bool
    failing: int
    detail: str
    per_partition: dict[str, Any]
    sample: list[dict[str, Any]]
    #: Keys of the partitions that failed a partition-level check (row_count, freshness).
    failed_partitions: tuple[str, ...] = ()


def judge(
    check: Check,
    windows: Sequence[PartitionWindow],
    values: Mapping[str, tuple[int, Any]],
    outside_rows: int,
) -> Verdict:
    """Turn per-partition aggregates ``{key: (rows, value)}`` into a verdict for ``check``."""
    per: dict[str, Any] = {}
    failing = 0
    bad_keys: list[str] = []
    for w in windows:
        rows, value = values.get(w.key, (0, None))
        ok, per[w.key], units = check.judge_partition(w, rows, value)
        failing += units
        if not ok:
            bad_keys.append(w.key)
    if check.unit == "batch":
        failing = outside_rows
    if check.unit == "partition":
        detail = f"{failing} of {len(windows)} partition(s) failed" + (
            f": {', '.join(bad_keys[:10])}" if bad_keys else ""
        )
    else:
        detail = f"{failing} failing row(s)"
    return Verdict(check, failing == 0, failing, detail, per, [], tuple(bad_keys))
