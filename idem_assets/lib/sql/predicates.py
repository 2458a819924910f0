"""The one place that says which rows a partition window holds, for every engine.

A window is a :data:`~idem_assets.lib.model.windows.Region`: boxes of conditions on the partition
terms (half-open time spans, category ``IN`` lists), ORed. A term is a column or a
``partition_expr`` expression (:func:`term`); either is rendered here and nowhere else.
:func:`region` turns a region into a sqlglot expression whose values are numbered parameters;
:func:`render` spells it in a dialect (``$n`` placeholders for DuckDB and PostgreSQL, ``:pn`` for
Spark) and :func:`inline` puts typed literals in their place for engines that take predicates as
text (Delta Lake). Consumers that are
not SQL walk the same region: :func:`arrow_expression` for pyarrow.compute.

Rendered text is cached by the region's shape (its columns and how many values each condition
holds), never by its values: the values stay bound parameters.
"""

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from idem_assets.lib.model import expressions
from idem_assets.lib.model.identifiers import validate_identifier
from idem_assets.lib.model.windows import Bound, Box, Condition, Region

#: sqlglot dialects whose drivers bind ``$1, $2, ...``; Spark binds named ``:p1, :p2, ...``.
NUMBERED = frozenset({"duckdb", "postgres"})
NAMED = frozenset({"spark", "databricks"})


class Statement(NamedTuple):
    """SQL text and the values it binds, in placeholder order."""

    sql: str
    params: list[Any]


class Params:
    """Numbers the values of one statement: each :meth:`add` returns its placeholder."""

    def __init__(self) -> None:
        """Start at ``$1``."""
        self.values: list[Any] = []

    def add(self, value: Any) -> exp.Expr:
        """A placeholder bound to ``value``."""
        self.values.append(value)
        return exp.Placeholder(this=str(len(self.values)))


#: The library's own column names start so; no user name can, as none may hold a '-'.
OWN_PREFIX = "idem-"


def column(name: str, alias: str | None = None) -> exp.Column:
    """A validated, always-quoted column reference (``alias."name"``)."""
    if not name.startswith(OWN_PREFIX):
        validate_identifier(name, "column")
    return exp.column(name, table=alias, quoted=True)


def term(name: str, alias: str | None = None, safe: bool = False) -> exp.Expr:
    """A partition term: a column, or a ``partition_expr`` expression cast to its result type.

    The cast pins the type the window's bounds are compared with on every engine (PostgreSQL's
    ``to_timestamp`` gives a TIMESTAMPTZ where DuckDB's ``strptime`` gives a TIMESTAMP).
    ``safe``: a value the expression cannot compute (text that is no date) is NULL instead of
    an error, so the guards count it among the rows of no partition, with a sample.
    """
    if not expressions.is_expression(name):
        return column(name, alias)

    def node(n: exp.Expr) -> exp.Expr:
        if isinstance(n, exp.Column):
            return exp.column(validate_identifier(n.name, "column"), table=alias, quoted=True)
        if safe and isinstance(n, exp.Cast) and not isinstance(n, exp.TryCast):
            return exp.TryCast(this=n.this, to=n.to)
        if safe and isinstance(n, exp.StrToTime | exp.StrToDate):
            n.set("safe", True)
        return n

    tree = expressions.parsed(name).transform(node, copy=True)
    kind = expressions.sql_type(expressions.result_type(name))
    while isinstance(tree, exp.Paren):
        tree = tree.this
    if isinstance(tree, exp.Cast) and tree.to == kind:
        return tree
    cast = exp.TryCast if safe else exp.Cast
    return cast(this=tree, to=kind)


def terms(names: Sequence[str], alias: str | None = None, safe: bool = False) -> list[exp.Expr]:
    """Partition terms (columns or expressions), as :func:`term` renders each."""
    return [term(n, alias, safe) for n in names]


def condition(
    cond: Condition, params: Params, alias: str | None = None, safe: bool = False
) -> exp.Expr:
    """One partition term inside any of its spans, or among its values."""
    c = term(cond.column, alias, safe)
    if cond.spans:
        spans = [
            exp.and_(
                exp.GTE(this=c.copy(), expression=params.add(start)),
                exp.LT(this=c.copy(), expression=params.add(end)),
            )
            for start, end in cond.spans
        ]
        return exp.paren(exp.or_(*spans)) if len(spans) > 1 else exp.paren(spans[0])
    return exp.In(this=c, expressions=[params.add(v) for v in cond.values])


def box(b: Box, params: Params, alias: str | None = None, safe: bool = False) -> exp.Expr:
    """Rows meeting every condition of a box."""
    parts = [condition(cond, params, alias, safe) for cond in b]
    return parts[0] if len(parts) == 1 else exp.paren(exp.and_(*parts))


def region(r: Region, params: Params, alias: str | None = None, safe: bool = False) -> exp.Expr:
    """Rows in any box of a region; an empty region holds every row (``TRUE``)."""
    if not r:
        return exp.true()
    parts = [box(b, params, alias, safe) for b in r]
    return parts[0] if len(parts) == 1 else exp.paren(exp.or_(*parts))


def has_expression(r: Region) -> bool:
    """Whether any condition of the region is on a ``partition_expr`` expression."""
    return any(expressions.is_expression(c.column) for b in r for c in b)


def values(r: Region) -> list[Any]:
    """The region's values in the order :func:`region` numbers them."""
    found: list[Any] = []
    for b in r:
        for cond in b:
            if cond.spans:
                found += [bound for span in cond.spans for bound in span]
            else:
                found += list(cond.values)
    return found


def render(tree: exp.Expr, dialect: str) -> str:
    """``tree`` in ``dialect``, its placeholders spelt as that dialect's driver binds them."""

    def placeholder(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, exp.Placeholder):
            return node
        if dialect in NAMED:
            return exp.Placeholder(this=f"p{node.name}")
        if dialect in NUMBERED:
            return exp.Parameter(this=exp.Literal.number(node.name))
        raise ValueError(f"no placeholder style for the {dialect!r} dialect")

    return tree.transform(placeholder, copy=True).sql(dialect=dialect)


def bind(params: Sequence[Any], dialect: str) -> list[Any] | dict[str, Any]:
    """The values as the dialect's driver takes them: a list, or names for Spark."""
    if dialect in NAMED:
        return {f"p{i}": v for i, v in enumerate(params, start=1)}
    return list(params)


def inline(tree: exp.Expr, params: Sequence[Any], literal: Callable[[Any], str]) -> str:
    """``tree`` as text with each placeholder replaced by ``literal(value)``, for text predicates.

    ``literal`` must return an expression that can neither end the literal nor change the
    statement (Delta Lake's typed ``arrow_cast`` literals, quotes doubled).
    """

    def replace(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Placeholder):
            return exp.maybe_parse(literal(params[int(node.name) - 1]), dialect="postgres")
        return node

    return tree.transform(replace, copy=True).sql(dialect="postgres")


@lru_cache(maxsize=512)
def _cached(shape: tuple[Any, ...], alias: str | None, dialect: str) -> str:
    return render(region(_from_shape(shape), Params(), alias), dialect)


def region_sql(r: Region, dialect: str, alias: str | None = None) -> Statement:
    """The region as a predicate in ``dialect`` with its values to bind (``TRUE`` when empty)."""
    return Statement(_cached(shape(r), alias, dialect), values(r))


def shape(r: Region) -> tuple[Any, ...]:
    """What the rendered text depends on: each condition's column and its number of values."""
    return tuple(tuple((c.column, len(c.spans), len(c.values)) for c in b) for b in r)


def _from_shape(s: tuple[Any, ...]) -> Region:
    """A region of the shape ``s`` with placeholder values (text depends only on the shape)."""
    out = []
    for b in s:
        conds = []
        for name, spans, count in b:
            if spans:
                conds.append(Condition(name, spans=tuple((0, 0) for _ in range(spans))))  # type: ignore[arg-type]
            else:
                conds.append(Condition(name, values=tuple(range(count))))
        out.append(tuple(conds))
    return tuple(out)


def arrow_expression(r: Region, types: dict[str, pa.DataType] | None = None) -> pc.Expression:
    """The region as a pyarrow.compute expression (rows of an Arrow table or dataset)."""
    if not r:
        return pc.scalar(True)

    def scalar(value: Bound | object, name: str) -> pa.Scalar:
        kind = (types or {}).get(name)
        return pa.scalar(value, type=kind) if kind is not None else pa.scalar(value)

    boxes = []
    for b in r:
        conds = []
        for cond in b:
            field = pc.field(cond.column)
            if cond.spans:
                spans = [
                    (field >= scalar(s, cond.column)) & (field < scalar(e, cond.column))
                    for s, e in cond.spans
                ]
                conds.append(_any(spans))
            else:
                kind = (types or {}).get(cond.column)
                conds.append(field.isin(pa.array(list(cond.values), type=kind)))
        boxes.append(_all(conds))
    return _any(boxes)


def _any(parts: list[pc.Expression]) -> pc.Expression:
    out = parts[0]
    for p in parts[1:]:
        out = out | p
    return out


def _all(parts: list[pc.Expression]) -> pc.Expression:
    out = parts[0]
    for p in parts[1:]:
        out = out & p
    return out
