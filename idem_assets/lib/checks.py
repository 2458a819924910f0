"""Data-quality checks that run on the staged batch before it is published.

Each check compiles to SQL aggregates. All of an asset's checks are evaluated together in one
scan of the batch, grouped by partition, so a chunked backfill still gets a verdict per day.
Freshness is measured against the end of each partition's window, never against the wall clock.
"""

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from typing import Any

import dagster as dg

from idem_assets.lib.identifiers import quote, validate_identifier
from idem_assets.lib.windows import PartitionWindow

#: Expected rows for a partition key (e.g. read from the file's manifest).
ExpectedRows = int | Mapping[str, int] | Callable[[str], int]

#: Name of the always-on check that every row lies inside the run's window.
IN_WINDOW_CHECK = "in_window"


@dataclass(frozen=True)
class Check:
    """One data-quality rule. Build them with the functions below, not directly."""

    name: str
    description: str
    kind: str
    columns: tuple[str, ...] = ()
    low: float | None = None
    high: float | None = None
    max_lag: timedelta | None = None
    expected: ExpectedRows | None = field(default=None, compare=False)
    blocking: bool = True

    def spec(
        self, asset_key: dg.AssetKey, partitions_def: dg.PartitionsDefinition | None = None
    ) -> dg.AssetCheckSpec:
        """The Dagster check spec, partitioned like its asset so each day gets its own verdict.

        Blocking checks stop downstream assets when they fail. ``partitions_def`` on a check is
        a Dagster preview API; README, "Dagster APIs in preview", names the fallback.
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
        c = [quote(x) for x in self.columns]
        if self.kind == "not_null":
            return " OR ".join(f"{x} IS NULL" for x in c)
        if self.kind == "between":
            # NaN sorts above every number in DuckDB, so NaN and infinities fail the range too.
            low, high = _double(self.low), _double(self.high)
            return f"({c[0]} < {low} OR {c[0]} > {high} OR isnan({c[0]}::DOUBLE))"
        return None


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
    return Check(
        name=name,
        description=desc,
        kind="row_count",
        low=min_rows,
        high=max_rows,
        expected=expected,
        blocking=blocking,
    )


def not_null(*columns: str, name: str | None = None, blocking: bool = True) -> Check:
    """No NULL in any of ``columns``."""
    cols = _cols(columns)
    return Check(
        name=name or _check_name(f"{'_'.join(cols)}_not_null"),
        description=f"No NULL in {', '.join(cols)}",
        kind="not_null",
        columns=cols,
        blocking=blocking,
    )


def unique(*columns: str, name: str | None = None, blocking: bool = True) -> Check:
    """No two rows of the batch share ``columns``."""
    cols = _cols(columns)
    return Check(
        name=name or _check_name(f"{'_'.join(cols)}_unique"),
        description=f"No duplicate ({', '.join(cols)}) in the batch",
        kind="unique",
        columns=cols,
        blocking=blocking,
    )


def between(
    column: str, low: float, high: float, *, name: str | None = None, blocking: bool = True
) -> Check:
    """Every non-NULL value of ``column`` lies in ``[low, high]``; NaN and infinities fail."""
    (col,) = _cols([column])
    return Check(
        name=name or _check_name(f"{col}_between_{_num(low)}_and_{_num(high)}"),
        description=f"{col} between {low:g} and {high:g}",
        kind="between",
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
    return Check(
        name=name or _check_name(f"{col}_freshness"),
        description=f"Newest {col} within {max_lag} of the end of its partition",
        kind="freshness",
        columns=(col,),
        max_lag=max_lag,
        blocking=blocking,
    )


def in_window(column: str) -> Check:
    """Every row's ``column`` lies inside the run's window (always on for partitioned assets)."""
    (col,) = _cols([column])
    return Check(
        name=IN_WINDOW_CHECK,
        description=f"Every {col} inside the run's partition window",
        kind="in_window",
        columns=(col,),
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
    aggs = ["count(*)"]
    for c in checks:
        pred = c.failing_predicate()
        if pred is not None:
            aggs.append(f"count(*) FILTER (WHERE {pred})")
        elif c.kind == "unique":
            cols = [quote(x) for x in c.columns]
            expr = cols[0] if len(cols) == 1 else f"row({', '.join(cols)})"
            aggs.append(f"count(*) - count(DISTINCT {expr})")
        elif c.kind == "freshness":
            aggs.append(f"max({quote(c.columns[0])})")
        else:
            aggs.append("NULL")
    return aggs


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
        if check.kind == "row_count":
            exp = expected_for(check, w.key)
            declared_nothing = exp is None and check.low is None and check.high is None
            ok = (
                not declared_nothing
                and (exp is None or rows == exp)
                and (check.low is None or rows >= check.low)
                and (check.high is None or rows <= check.high)
            )
            per[w.key] = {
                "rows": rows,
                "expected": exp,
                "delta": None if exp is None else rows - exp,
            }
            failing += 0 if ok else 1
        elif check.kind == "freshness":
            assert check.max_lag is not None
            lag = freshness_lag(w.end, value)
            ok = lag is not None and lag <= check.max_lag
            per[w.key] = {"newest": str(value), "lag": str(lag)}
            failing += 0 if ok else 1
        elif check.kind == "in_window":
            ok = True
            per[w.key] = {"rows": rows}
        else:
            ok = not value
            per[w.key] = {"failing": int(value or 0)}
            failing += int(value or 0)
        if not ok:
            bad_keys.append(w.key)
    if check.kind == "in_window":
        failing = outside_rows
    passed = failing == 0
    if check.kind in ("row_count", "freshness"):
        detail = f"{failing} of {len(windows)} partition(s) failed" + (
            f": {', '.join(bad_keys[:10])}" if bad_keys else ""
        )
    else:
        detail = f"{failing} failing row(s)"
    return Verdict(check, passed, failing, detail, per, [], tuple(bad_keys))
