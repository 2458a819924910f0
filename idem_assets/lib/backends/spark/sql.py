"""The statements only the Spark engine runs: row hashes and pruned windows, in Spark SQL.

Built as sqlglot trees like every statement of the library (:mod:`idem_assets.lib.sql`) and
rendered in the ``spark`` dialect with named ``:pN`` parameters; values are always bound.
"""

from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlglot import exp

from idem_assets.lib.model.windows import Box, Cell, Condition, Region
from idem_assets.lib.sql import predicates
from idem_assets.lib.sql.predicates import Params, Statement, render
from idem_assets.lib.sql.statements import Rel, columns, relation

#: The day a timestamp partition column's rows are stored under: the table's partition column.
DAY = "idem_day"


def day_of(value: Any) -> date:
    """The day a bound falls in, in UTC for an aware timestamp."""
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value.date()
    assert isinstance(value, date), value
    return value


def last_day(end: Any) -> date:
    """The day of the last instant before a half-open span's ``end``."""
    if isinstance(end, datetime):
        return day_of(end - timedelta(microseconds=1))
    return end - timedelta(days=1)


def with_days(region: Region, time_column: str | None) -> Region:
    """``region`` with each box also bounded on :data:`DAY`, so Spark prunes partitions."""
    if time_column is None:
        return region
    boxes = []
    for box in region:
        extra: list[Condition] = []
        for cond in box:
            if cond.column == time_column and cond.spans:
                spans = tuple(
                    (day_of(lo), last_day(hi) + timedelta(days=1)) for lo, hi in cond.spans
                )
                extra.append(Condition(DAY, spans=spans))
        boxes.append((*box, *extra))
    return tuple(boxes)


def _hash_sum(names: Sequence[str]) -> Any:
    hashed = exp.Anonymous(this="xxhash64", expressions=columns(sorted(names)))
    # Spark 4 runs in ANSI mode: a BIGINT sum of hashes overflows; DECIMAL(38, 0) holds it.
    total = exp.Sum(this=exp.Cast(this=hashed, to=exp.DataType.build("DECIMAL(38, 0)")))
    return exp.func("coalesce", total, exp.Literal.number(0))


def fingerprint(source: Rel, names: Sequence[str], region: Region) -> Statement:
    """Count and hash sum of ``source``'s rows in ``region`` (every row without one)."""
    params = Params()
    tree = exp.select(exp.Count(this=exp.Star()), _hash_sum(names)).from_(relation(source))
    if region:
        tree = tree.where(predicates.region(region, params))
    return Statement(render(tree, "spark"), params.values)


def partition_fingerprints(source: Rel, names: Sequence[str], cells: Sequence[Cell]) -> Statement:
    """Rows of ``(key, count, hash sum)`` for each partition of a range that holds rows."""
    params = Params()
    case = exp.Case()
    for key, box in cells:
        case = case.when(predicates.box(box, params), params.add(key))
    inside = predicates.region(tuple(b for _, b in cells), params)
    tree = (
        exp.select(exp.alias_(case, "k"), exp.Count(this=exp.Star()), _hash_sum(names))
        .from_(relation(source))
        .where(inside)
        .group_by(exp.Literal.number(1))
    )
    return Statement(render(tree, "spark"), params.values)


def select(
    source: Rel,
    names: Sequence[str],
    region: Region,
    order: Sequence[str] = (),
    negate: bool = False,
) -> Statement:
    """``names`` of the rows in ``region`` (outside it with ``negate``), ordered by ``order``."""
    params = Params()
    tree = exp.select(*columns(names)).from_(relation(source))
    if region:
        condition = predicates.region(region, params)
        tree = tree.where(exp.not_(exp.paren(condition)) if negate else condition)
    if order:
        tree = tree.order_by(*columns(order))
    return Statement(render(tree, "spark"), params.values)


#: The columns :func:`placed` adds: a row's partition of the window, and whether it is outside.
CELL = "idem_cell"
OUTSIDE = "idem_outside"


def placed(
    source: Rel,
    names: Sequence[str],
    region: Region,
    cells: Sequence[Cell],
    bounds: Mapping[str, tuple[Any, Any]] | None = None,
) -> Statement:
    """``names`` of the rows, with where each lies: :data:`CELL` and :data:`OUTSIDE`.

    :data:`CELL` is the row's partition of a range (``''`` in a window of one partition), NULL
    outside the window; :data:`OUTSIDE` is true outside it, NULL where the row's partition
    values are (such a row is neither in the window nor outside it). Only rows whose columns
    lie within ``bounds`` (smallest and largest value per column), which Parquet's statistics
    skip to.
    """
    params = Params()
    cell: exp.Expr = exp.Literal.string("")
    if cells:
        case = exp.Case()
        for key, box in cells:
            case = case.when(predicates.box(box, params), params.add(key))
        cell = case
    elif region:
        cell = exp.Case().when(predicates.region(region, params), exp.Literal.string(""))
    outside = exp.not_(exp.paren(predicates.region(region, params))) if region else exp.false()
    placements = [exp.alias_(cell, CELL), exp.alias_(outside, OUTSIDE)]
    tree = exp.select(*columns(names), *placements).from_(relation(source))
    within = [
        exp.Between(this=predicates.column(c), low=params.add(lo), high=params.add(hi))
        for c, (lo, hi) in (bounds or {}).items()
    ]
    if within:
        tree = tree.where(exp.and_(*within))
    return Statement(render(tree, "spark"), params.values)


def in_box(box: Box) -> Statement:
    """A box as a predicate of its own, for a DataFrame's ``where``."""
    params = Params()
    return Statement(render(predicates.box(box, params), "spark"), params.values)
