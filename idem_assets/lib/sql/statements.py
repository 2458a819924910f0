"""Every statement a publish or a load runs, written once and rendered in any engine's dialect.

The guards judge the staged batch with these statements in the evaluator (the embedded DuckDB, or
the engine's own where it brings one); the backends count, delete and read their tables with
them in their own dialect. Each function takes validated identifiers and a window's
:data:`~idem_assets.lib.model.windows.Region` (or its cells) and returns a
:class:`~idem_assets.lib.sql.predicates.Statement`: text for ``dialect`` plus the values to bind.
Identifiers are validated and quoted; values are always bound, never formatted in.

Rendered text is cached by the statement's shape: its identifiers and how many values each
condition holds, with every value and every relation name stood in for, so the publishes of one
asset render each statement once per process.
"""

import inspect
from collections.abc import Callable, Sequence
from functools import lru_cache, wraps
from typing import Any, ParamSpec

import sqlglot
from sqlglot import exp

from idem_assets.lib.model.identifiers import validate_identifier
from idem_assets.lib.model.windows import Bound, Box, Cell, Condition, Region
from idem_assets.lib.sql import predicates
from idem_assets.lib.sql.predicates import Params, Statement, bind, column, render, terms

__all__ = ["Statement", "bind"]

#: A relation: one name (a registered batch, a view), or its parts (``schema``, ``table``).
Rel = str | tuple[str, ...]

P = ParamSpec("P")

#: Stands in for a relation while a statement's shape is rendered: no identifier can hold '-'
#: unquoted, and the library's own names never end so.
_REL = "idem-relation-{}-"


def relation(rel: Rel) -> exp.Table:
    """A relation with every part quoted: ``"schema"."table"``."""
    parts = (rel,) if isinstance(rel, str) else tuple(rel)
    *db, name = parts
    return exp.Table(
        this=exp.to_identifier(name, quoted=True),
        db=exp.to_identifier(db[-1], quoted=True) if db else None,
    )


def _own(name: str) -> exp.Column:
    """One of the library's own names, which no user column can have (it is not plain)."""
    return exp.column(name, quoted=True)


def columns(names: Sequence[str], alias: str | None = None) -> list[exp.Column]:
    """Validated, quoted column references."""
    return [column(validate_identifier(c, "column"), alias) for c in names]


def _abstract(value: Any, found: list[Any]) -> Any:
    """``value`` with each window value replaced by its index in ``found`` (appended there)."""
    if isinstance(value, Condition):
        spans = tuple(tuple(_slot(b, found) for b in span) for span in value.spans)
        values = tuple(_slot(v, found) for v in value.values)
        return Condition(value.column, spans=spans, values=values)  # type: ignore[arg-type]
    if isinstance(value, tuple | list):
        return tuple(_abstract(v, found) for v in value)
    return value


def _slots(value: Any, found: list[Any]) -> Any:
    """Every leaf of nested tuples or lists replaced by its index in ``found``."""
    if isinstance(value, tuple | list):
        return tuple(_slots(v, found) for v in value)
    return _slot(value, found)


def _slot(value: Any, found: list[Any]) -> int:
    found.append(value)
    return len(found) - 1


def statement(
    *, windows: Sequence[str] = (), relations: Sequence[str] = (), values: Sequence[str] = ()
) -> Callable[[Callable[..., exp.Expr]], Callable[..., Statement]]:
    """Make a tree builder a cached statement.

    The builder takes a :class:`Params` first and the statement's arguments after; ``windows``
    names the arguments holding regions or boxes (and ``cells``, a range's ``(key, box)``
    pairs, whose keys are bound too), ``relations`` those naming relations,
    ``values`` those whose items are values to bind. The text is rendered once per shape and
    dialect; the values are bound in the order the builder numbered them.
    """

    def wrap(build: Callable[..., exp.Expr]) -> Callable[..., Statement]:
        signature = inspect.signature(build)

        @lru_cache(maxsize=1024)
        def shaped(key: tuple[tuple[str, Any], ...], dialect: str) -> tuple[str, tuple[int, ...]]:
            params = Params()
            tree = build(params, **dict(key))
            text = render(tree, dialect)
            return text, tuple(params.values)

        @wraps(build)
        def run(*args: Any, dialect: str = "duckdb", **kwargs: Any) -> Statement:
            bound = signature.bind(None, *args, **kwargs)
            bound.apply_defaults()
            found: list[Any] = []
            shape, names = [], {}
            for name, value in list(bound.arguments.items())[1:]:
                if name == "cells":
                    value = tuple((_slot(k, found), _abstract(b, found)) for k, b in value)
                elif name in windows:
                    value = _abstract(value, found)
                elif name in values:
                    value = _slots(value, found)
                elif name in relations:
                    names[name] = value
                    value = _REL.format(name)
                shape.append((name, _hashable(value)))
            text, order = shaped(tuple(shape), dialect)
            for name, rel in names.items():
                stand_in = relation(_REL.format(name)).sql(dialect=dialect)
                text = text.replace(stand_in, relation(rel).sql(dialect=dialect))
            return Statement(text, [found[i] for i in order])

        return run

    return wrap


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


def _where(tree: exp.Select, condition: exp.Expr | None) -> exp.Select:
    return tree.where(condition) if condition is not None else tree


def _count_if(condition: exp.Expr) -> exp.Expr:
    return exp.Filter(this=exp.Count(this=exp.Star()), expression=exp.Where(this=condition))


def _any_null(cols: Sequence[exp.Expr]) -> exp.Expr:
    return exp.or_(*[exp.Is(this=c.copy(), expression=exp.Null()) for c in cols])


def _none_null(cols: Sequence[exp.Expr]) -> exp.Expr:
    return exp.and_(*[exp.not_(exp.Is(this=c.copy(), expression=exp.Null())) for c in cols])


def _region(
    params: Params, region: Region, alias: str | None = None, safe: bool = False
) -> exp.Expr:
    return predicates.region(region, params, alias, safe)


def _key_tuple(cols: Sequence[exp.Expr]) -> exp.Expr:
    return cols[0] if len(cols) == 1 else exp.Tuple(expressions=list(cols))


# The staged batch ------------------------------------------------------------------------------


@statement(windows=("region",), relations=("source",))
def batch_profile(
    params: Params,
    source: Rel,
    partition_columns: Sequence[str],
    region: Region,
    key: Sequence[str],
    count_duplicates: bool = True,
) -> exp.Expr:
    """One scan of the batch: rows, NULL partition values, stray rows, NULL keys, duplicates.

    Columns returned: ``rows, null_partition, outside_window, null_key, duplicate_keys``. A
    ``partition_expr`` expression that cannot compute a row's value counts it as NULL.
    """
    zero = exp.Literal.number(0)
    null_partition, outside, null_key, duplicates = zero, zero, zero, zero
    if partition_columns:
        pcs = terms(partition_columns, safe=True)
        null_partition = _count_if(_any_null(pcs))
        if region:
            inside = _region(params, region, safe=True)
            outside = _count_if(exp.and_(exp.not_(exp.paren(_any_null(pcs))), exp.not_(inside)))
    if key:
        kc = columns(key)
        null_key = _count_if(_any_null(kc))
        if count_duplicates:
            # The costliest part of the scan; skipped where nobody needs it. Counted over the
            # keys grouped, not as count(DISTINCT): a grouping spills to disk past the memory
            # limit (a streamed batch bigger than memory), a distinct aggregate cannot.
            duplicates = _duplicates(source, kc)
    return exp.select(
        exp.Count(this=exp.Star()), null_partition, outside, null_key, duplicates
    ).from_(relation(source))


def _duplicates(source: Rel, key: Sequence[exp.Expr]) -> exp.Expr:
    """Rows beyond the first of each key: ``sum(n - 1)`` over the keys held more than once."""
    n = exp.to_identifier("idem-n", quoted=True)
    grouped = (
        exp.select(exp.alias_(exp.Count(this=exp.Star()), n)).from_(relation(source)).group_by(*key)
    )
    extra = exp.Sub(this=exp.column(n), expression=exp.Literal.number(1))
    total = (
        exp.select(exp.Coalesce(this=exp.Sum(this=extra), expressions=[exp.Literal.number(0)]))
        .from_(grouped.subquery(exp.to_identifier("idem-keys", quoted=True)))
        .where(exp.GT(this=exp.column(n), expression=exp.Literal.number(1)))
    )
    return exp.Subquery(this=total)


@statement(windows=("region",), relations=("source",))
def stray_rows_sample(
    params: Params, source: Rel, partition_columns: Sequence[str], region: Region, limit: int = 5
) -> exp.Expr:
    """A few rows outside the window (a NULL partition value is not stray), in column order."""
    pcs = terms(partition_columns, safe=True)
    return (
        exp.select("*")
        .from_(relation(source))
        .where(exp.and_(_none_null(pcs), exp.not_(_region(params, region, safe=True))))
        .order_by(*[c.copy() for c in pcs])
        .limit(int(limit))
    )


@statement(relations=("source",))
def null_sample(params: Params, source: Rel, names: Sequence[str], limit: int = 5) -> exp.Expr:
    """A few rows with NULL in any of ``names`` (partition terms or keys)."""
    found = _any_null(terms(names, safe=True))
    return exp.select("*").from_(relation(source)).where(found).limit(limit)


@statement(relations=("source",))
def duplicate_key_sample(
    params: Params, source: Rel, key: Sequence[str], limit: int = 5
) -> exp.Expr:
    """Rows of the first few duplicated keys, grouped together."""
    kc = columns(key)
    dupes = (
        exp.select(*[c.copy() for c in kc])
        .from_(relation(source))
        .group_by(*[c.copy() for c in kc])
        .having(exp.GT(this=exp.Count(this=exp.Star()), expression=exp.Literal.number(1)))
        .order_by(*[c.copy() for c in kc])
        .limit(int(limit))
    )
    return (
        exp.select("*")
        .from_(relation(source))
        .where(exp.In(this=_key_tuple([c.copy() for c in kc]), query=dupes.subquery()))
        .order_by(*[c.copy() for c in kc])
        .limit(int(limit) * 2)
    )


def _partition_case(params: Params, cells: Sequence[Cell], alias: str | None) -> exp.Expr:
    """A CASE naming the partition each row falls in (NULL outside them all)."""
    case = exp.Case()
    for key, b in cells:
        condition = predicates.box(b, params, alias)
        case = case.when(condition, params.add(key))
    return case


@statement(windows=("cells",), relations=("source",), values=("outside",))
def rows_by_partition(
    params: Params, source: Rel, cells: Sequence[Cell], key: str, outside: str
) -> exp.Expr:
    """Every row of ``source`` with a column ``key`` naming its partition (``outside`` if none)."""
    case = exp.func("coalesce", _partition_case(params, cells, None), params.add(outside))
    return exp.select(exp.Star(), exp.alias_(case, key, quoted=True)).from_(relation(source))


@statement(windows=("cells",), relations=("source",))
def count_by_partition(params: Params, source: Rel, cells: Sequence[Cell]) -> exp.Expr:
    """Rows of ``source`` in each partition: rows of ``(key, count)``, empty ones absent."""
    case = _partition_case(params, cells, None)
    inside = _region(params, tuple(b for _, b in cells))
    return (
        exp.select(exp.alias_(case, "partition_key", quoted=True), exp.Count(this=exp.Star()))
        .from_(relation(source))
        .where(inside)
        .group_by(exp.Literal.number(1))
    )


@statement(relations=("source",))
def dedupe(
    params: Params,
    source: Rel,
    key: Sequence[str],
    order_by: Sequence[str],
    names: Sequence[str],
) -> exp.Expr:
    """Keep one row per key: the greatest ``order_by`` wins.

    Ties on ``order_by`` are broken by every remaining column, so the winner never depends on
    the order rows arrived in; rows that tie on every column are identical, so any one will do.
    """
    return _deduped(relation(source), key, order_by, names)


def _deduped(
    source: exp.Expr, key: Sequence[str], order_by: Sequence[str], names: Sequence[str]
) -> exp.Select:
    """:func:`dedupe`'s rows, read from any table expression."""
    # Sorted, so the winner of an exact tie does not depend on the batch's column order either.
    rest = sorted(c for c in names if c not in key and c not in order_by)
    order = [exp.Ordered(this=c, desc=True, nulls_first=False) for c in columns(order_by)] + [
        exp.Ordered(this=c, desc=False, nulls_first=False) for c in columns(rest)
    ]
    rank = exp.Window(
        this=exp.RowNumber(),
        partition_by=columns(key),
        order=exp.Order(expressions=order),
    )
    ranked = exp.select(*columns(names), exp.alias_(rank, "idem-rank", quoted=True)).from_(source)
    return (
        exp.select(*columns(names))
        .from_(ranked.subquery("ranked"))
        .where(exp.EQ(this=_own("idem-rank"), expression=exp.Literal.number(1)))
    )


def window_predicate(
    name: str,
    spans: Sequence[tuple[Bound, Bound]],
    alias: str | None = None,
    dialect: str = "duckdb",
) -> Statement:
    """``name`` inside any half-open span."""
    return _condition(Condition(name, spans=tuple(spans)), alias, dialect=dialect)


@statement(windows=("cond",))
def _condition(params: Params, cond: Condition, alias: str | None) -> exp.Expr:
    return predicates.condition(cond, params, alias)


# Fingerprints ----------------------------------------------------------------------------------


def _row_hash(names: Sequence[str]) -> exp.Expr:
    """The sum of the rows' hashes, as a 128-bit integer (DuckDB's ``hash`` of every column)."""
    # Sorted, so a table's column order does not change its fingerprint.
    hashed = exp.Anonymous(this="hash", expressions=columns(sorted(names)))
    total = exp.Sum(this=exp.Cast(this=hashed, to=exp.DataType.build("HUGEINT", dialect="duckdb")))
    return exp.func("coalesce", total, exp.Literal.number(0))


@statement(windows=("region",), relations=("target",))
def fingerprint(params: Params, target: Rel, names: Sequence[str], region: Region = ()) -> exp.Expr:
    """An order-independent fingerprint of the rows: their count and the sum of row hashes.

    A sum (not an XOR) is used so that a doubled row changes the fingerprint.
    """
    tree = exp.select(exp.Count(this=exp.Star()), _row_hash(names)).from_(relation(target))
    return _where(tree, _region(params, region) if region else None)


@statement(windows=("cells",), relations=("target",))
def partition_fingerprints(
    params: Params, target: Rel, names: Sequence[str], cells: Sequence[Cell]
) -> exp.Expr:
    """Per-partition count and hash sum in one scan: rows of ``(key, count, hash_sum)``."""
    case = _partition_case(params, cells, None)
    inside = _region(params, tuple(b for _, b in cells))
    return (
        exp.select(
            exp.alias_(case, "partition_key", quoted=True),
            exp.Count(this=exp.Star()),
            _row_hash(names),
        )
        .from_(relation(target))
        .where(inside)
        .group_by(exp.Literal.number(1))
    )


# Plans -----------------------------------------------------------------------------------------

#: What :func:`plan_diff` returns per partition, in order.
PLAN_COLUMNS = (
    "partition_key",
    "rows_before",
    "hash_before",
    "rows_after",
    "hash_after",
    "inserted",
    "updated",
    "deleted",
    "unchanged",
    "exact",
)


def _after_side(
    after: Rel, names: Sequence[str], key: Sequence[str], order_by: Sequence[str]
) -> exp.Select:
    """The batch's rows as the publish writes them: one per key, the latest, with ``order_by``."""
    if order_by and key:
        return _deduped(relation(after), key, order_by, names)
    return exp.select(*columns(names)).from_(relation(after))


def _before_side(
    params: Params, before: Rel, names: Sequence[str], missing: Sequence[str], region: Region
) -> exp.Select:
    """The stored rows of the window, in the batch's columns: NULL in the ones it adds."""
    picked = [
        exp.alias_(exp.Null(), validate_identifier(n, "column"), quoted=True)
        if n in missing
        else column(n)
        for n in names
    ]
    tree = exp.select(*picked).from_(relation(before))
    return _where(tree, _region(params, region) if region else None)


def _hashed(
    params: Params,
    side: exp.Select,
    names: Sequence[str],
    key: Sequence[str],
    cells: Sequence[Cell],
) -> exp.Select:
    """Each row's partition, key (as the library's own names) and hash: one side of a plan."""
    partition = _partition_case(params, cells, None) if cells else exp.Null()
    keys = [exp.alias_(c, f"idem-k{i}", quoted=True) for i, c in enumerate(columns(key))]
    hashed = exp.Anonymous(this="hash", expressions=columns(sorted(names)))
    return exp.select(
        exp.alias_(partition, "idem-p", quoted=True),
        *keys,
        exp.alias_(hashed, "idem-h", quoted=True),
    ).from_(side.subquery("side"))


#: By content, the cheap way: each side's count and hash sum per partition (its fingerprints);
#: where they differ, one full join of the two sides' row hashes. Its pairs are the rows a
#: publish leaves as they are, unless a row repeats on both sides of a pair (its last column,
#: "exact", is false then): :data:`_BY_PAIRS` counts those pair by pair. A row repeating on one
#: side only pairs with the other's one copy, so that side's matched rows are the count. A
#: partition whose fingerprints agree holds the batch's rows already (the fingerprint is how
#: the library tells content apart), so none of its rows is joined. Identical rows lie in one
#: partition, so the row hash alone pairs them.
_BY_CONTENT = """
SELECT p, nb, hb, na, ha, na - same, 0, nb - same, same, exact
FROM (
  SELECT t.p, t.nb, t.hb, t.na, t.ha,
    CASE
      WHEN t.na = t.nb AND t.ha = t.hb THEN t.na
      WHEN j.pairs = t.nb - j.only_b THEN t.na - j.only_a
      ELSE t.nb - j.only_b
    END AS same,
    coalesce(j.pairs IN (t.na - j.only_a, t.nb - j.only_b), TRUE) AS exact
  FROM "idem-totals" AS t LEFT JOIN "idem-joined" AS j ON j.p IS NOT DISTINCT FROM t.p
) AS planned
"""
_BY_CONTENT_STEPS = (
    (
        '"idem-totals"',
        """
        SELECT p, count(*) FILTER (WHERE side = 1) AS nb,
          coalesce(sum(CAST(h AS HUGEINT)) FILTER (WHERE side = 1), 0) AS hb,
          count(*) FILTER (WHERE side = 0) AS na,
          coalesce(sum(CAST(h AS HUGEINT)) FILTER (WHERE side = 0), 0) AS ha
        FROM (
          SELECT "idem-p" AS p, "idem-h" AS h, 0 AS side FROM "idem-after"
          UNION ALL
          SELECT "idem-p", "idem-h", 1 FROM "idem-before"
        ) AS sides
        GROUP BY 1
        """,
    ),
    ('"idem-changed"', 'SELECT p FROM "idem-totals" WHERE na <> nb OR ha <> hb'),
    (
        '"idem-joined"',
        """
        SELECT coalesce(a."idem-p", b."idem-p") AS p,
          count(*) FILTER (WHERE b."idem-h" IS NULL) AS only_a,
          count(*) FILTER (WHERE a."idem-h" IS NULL) AS only_b,
          count(*) FILTER (WHERE a."idem-h" IS NOT NULL AND b."idem-h" IS NOT NULL) AS pairs
        FROM (
          SELECT s.* FROM "idem-after" AS s
          SEMI JOIN "idem-changed" AS c ON s."idem-p" IS NOT DISTINCT FROM c.p
        ) AS a
        FULL JOIN (
          SELECT s.* FROM "idem-before" AS s
          SEMI JOIN "idem-changed" AS c ON s."idem-p" IS NOT DISTINCT FROM c.p
        ) AS b ON a."idem-h" = b."idem-h"
        GROUP BY 1
        """,
    ),
)

#: Every row pair counted: a multiset of (partition, row hash) pairs on each side. Exact where
#: rows repeat; it costs an aggregate over every row of both sides.
_BY_PAIRS = """
SELECT p, sum(nb), coalesce(sum(nb * CAST(h AS HUGEINT)), 0), sum(na),
  coalesce(sum(na * CAST(h AS HUGEINT)), 0), sum(na - least(na, nb)), 0,
  sum(nb - least(na, nb)), sum(least(na, nb)), TRUE
FROM (
  SELECT p, h, count(*) FILTER (WHERE side = 0) AS na, count(*) FILTER (WHERE side = 1) AS nb
  FROM (
    SELECT "idem-p" AS p, "idem-h" AS h, 0 AS side FROM "idem-after"
    UNION ALL
    SELECT "idem-p", "idem-h", 1 FROM "idem-before"
  ) AS sides
  GROUP BY 1, 2
) AS pairs
GROUP BY 1
"""

#: By key: a planned row inserts a key the window lacks, updates one whose row differs, or
#: leaves it; a stored row whose key the batch lacks is deleted or kept ({kept}).
_BY_KEY = """
SELECT p, sum(rb), coalesce(sum(CAST(hb AS HUGEINT)), 0), sum(ra),
  coalesce(sum(CAST(ha AS HUGEINT)), 0), sum(ins), sum(upd), sum(del), sum(same), TRUE
FROM (
  SELECT ap AS p, 0 AS rb, NULL AS hb, 1 AS ra, ah AS ha, CAST(bh IS NULL AS INT) AS ins,
    CAST(bh IS NOT NULL AND ah <> bh AS INT) AS upd, 0 AS del,
    CAST(bh IS NOT NULL AND ah = bh AS INT) AS same
  FROM j WHERE ah IS NOT NULL
  UNION ALL
  SELECT bp, 1, bh, {kept}, CASE WHEN {kept} = 1 THEN bh END, 0, 0, 1 - {kept}, {kept}
  FROM j WHERE bh IS NOT NULL AND ah IS NULL
  UNION ALL
  SELECT bp, 1, bh, 0, NULL, 0, 0, 0, 0 FROM j WHERE bh IS NOT NULL AND ah IS NOT NULL
) AS sides
GROUP BY 1
"""


@statement(windows=("cells", "region"), relations=("after", "before"))
def plan_diff(
    params: Params,
    after: Rel,
    before: Rel,
    names: Sequence[str],
    key: Sequence[str],
    cells: Sequence[Cell],
    delete_missing: bool = False,
    region: Region = (),
    missing: Sequence[str] = (),
    order_by: Sequence[str] = (),
    pairs: bool = False,
) -> exp.Expr:
    """What a publish of ``after`` does to the window ``before`` holds: :data:`PLAN_COLUMNS`.

    Without ``key`` (an overwrite) rows are compared by content: a changed row is one deleted
    and one inserted. With ``key`` (a merge) a batch row whose key the window holds updates it
    when its content differs; the window's other rows are deleted with ``delete_missing``, kept
    otherwise. Hashes and sums are the fingerprint's (:func:`fingerprint`), so the planned
    fingerprint is the one the publish would leave. One row per partition of ``cells`` (one
    row under NULL without cells). ``before`` is read inside ``region`` (the table itself, where
    the evaluator reads it) with NULL in the ``missing`` columns the publish adds; ``after`` is
    deduplicated by ``order_by`` as the write does. An overwrite is compared by one full join,
    exact unless a row repeats on both sides (its ``exact`` column is then false), or with
    ``pairs`` by an aggregate over every row, exact always. DuckDB's dialect only: it runs in
    the evaluator.
    """
    a = _hashed(params, _after_side(after, names, key, order_by), names, key, cells)
    b = _hashed(params, _before_side(params, before, names, missing, region), names, key, cells)
    if not key:
        tree = sqlglot.parse_one(_BY_PAIRS if pairs else _BY_CONTENT, read="duckdb")
        assert isinstance(tree, exp.Select)
        tree = tree.with_('"idem-after"', as_=a).with_('"idem-before"', as_=b)
        for name, step in () if pairs else _BY_CONTENT_STEPS:
            tree = tree.with_(name, as_=step, dialect="duckdb")
        return tree
    # The key columns go by the library's own names, so no user name is spelt in this text.
    same = " AND ".join(f'a."idem-k{i}" = b."idem-k{i}"' for i in range(len(key)))
    joined = (
        'SELECT a."idem-p" AS ap, b."idem-p" AS bp, a."idem-h" AS ah, b."idem-h" AS bh'
        f' FROM "idem-after" AS a FULL JOIN "idem-before" AS b ON {same}'
    )
    tree = sqlglot.parse_one(_BY_KEY.format(kept="0" if delete_missing else "1"), read="duckdb")
    assert isinstance(tree, exp.Select)
    return (
        tree.with_('"idem-after"', as_=a)
        .with_('"idem-before"', as_=b)
        .with_("j", as_=joined, dialect="duckdb")
    )


@statement(windows=("region",), relations=("after", "before"))
def planned_rows(
    params: Params,
    after: Rel,
    before: Rel,
    names: Sequence[str],
    key: Sequence[str],
    keep_missing: bool,
    region: Region = (),
    missing: Sequence[str] = (),
    order_by: Sequence[str] = (),
) -> exp.Expr:
    """The window's rows as a publish of ``after`` leaves them, read as :func:`plan_diff` reads.

    The batch's rows; with ``keep_missing`` (an upsert) also the stored rows whose key the
    batch lacks. DuckDB's dialect only.
    """
    written = _after_side(after, names, key, order_by)
    if not (keep_missing and key):
        return written
    stored = _before_side(params, before, names, missing, region).subquery("b")
    same = exp.and_(*[exp.EQ(this=column(k, "a"), expression=column(k, "b")) for k in key])
    batch_holds = exp.Exists(
        this=exp.select(exp.Literal.number(1)).from_(written.subquery("a")).where(same)
    )
    kept = exp.select(*columns(names, "b")).from_(stored).where(exp.not_(batch_holds))
    return exp.union(written, kept, distinct=False)


# The target ------------------------------------------------------------------------------------


@statement(windows=("region",), relations=("target",))
def count_window(params: Params, target: Rel, region: Region) -> exp.Expr:
    """Rows currently in the window (the whole table when unpartitioned)."""
    tree = exp.select(exp.Count(this=exp.Star())).from_(relation(target))
    return _where(tree, _region(params, region) if region else None)


@statement(windows=("region",), relations=("target",))
def delete_window(params: Params, target: Rel, region: Region) -> exp.Expr:
    """Delete the window's rows (the overwrite's first half; never touches other partitions)."""
    return exp.delete(relation(target), where=_region(params, region))


@statement(relations=("target",))
def delete_all(params: Params, target: Rel) -> exp.Expr:
    """Delete every row: the scope of an unpartitioned asset is its whole table."""
    return exp.delete(relation(target))


def _key_in(
    params: Params, keys: Rel, key: Sequence[str], ranges: Sequence[tuple[Any, Any]]
) -> exp.Expr:
    """Rows of ``t`` whose key ``keys`` holds, first narrowed to each key column's range.

    The range costs a comparison per row and spares the probe for every row outside it: keys
    handed out in order (ids, times) put a batch's keys in a narrow range, and any key equal to
    one of the batch lies inside it, so it never drops a match. A semi-join: duplicate keys in
    ``keys`` cannot multiply the matches.
    """
    kc = columns(key, "t")
    narrow = [
        exp.Between(this=c.copy(), low=params.add(low), high=params.add(high))
        for c, (low, high) in zip(kc, ranges, strict=False)
    ]
    hit = exp.In(
        this=_key_tuple([c.copy() for c in kc]),
        query=exp.select(*columns(key)).from_(relation(keys)).subquery(),
    )
    return exp.and_(*narrow, hit) if narrow else hit


def _target(target: Rel) -> exp.Expr:
    return relation(target).as_("t", quoted=False)


@statement(values=("ranges",), relations=("target", "keys"))
def delete_matching_keys(
    params: Params,
    target: Rel,
    keys: Rel,
    key: Sequence[str],
    ranges: Sequence[tuple[Any, Any]] = (),
) -> exp.Expr:
    """Delete target rows whose key ``keys`` holds (the upsert's update half)."""
    return exp.delete(_target(target), where=_key_in(params, keys, key, _pairs(ranges)))


def _pairs(ranges: Sequence[Any]) -> list[tuple[Any, Any]]:
    """Each key column's ``(low, high)``."""
    return [(low, high) for low, high in ranges]


@statement(windows=("region",), values=("ranges",), relations=("target", "keys"))
def merge_counts(
    params: Params,
    target: Rel,
    keys: Rel,
    key: Sequence[str],
    region: Region,
    ranges: Sequence[tuple[Any, Any]] = (),
) -> exp.Expr:
    """Target rows whose key the batch holds: inside the window, and *outside* it.

    Columns returned: ``matched_in_window, matched_outside_window``.
    """
    hit = _key_in(params, keys, key, _pairs(ranges))
    if not region:
        return (
            exp.select(exp.Count(this=exp.Star()), exp.Literal.number(0))
            .from_(_target(target))
            .where(hit)
        )
    inside = _region(params, region, "t")
    outside = _region(params, region, "t")
    return (
        exp.select(_count_if(inside), _count_if(exp.not_(outside)))
        .from_(_target(target))
        .where(hit)
    )


@statement(windows=("cells",), values=("ranges",), relations=("target", "keys"))
def matched_by_partition(
    params: Params,
    target: Rel,
    keys: Rel,
    key: Sequence[str],
    cells: Sequence[Cell],
    ranges: Sequence[tuple[Any, Any]] = (),
) -> exp.Expr:
    """Target rows whose key the batch holds, per partition: rows of ``(key, count)``.

    Rows outside every partition come back under the key NULL.
    """
    case = _partition_case(params, cells, "t")
    hit = _key_in(params, keys, key, _pairs(ranges))
    return (
        exp.select(exp.alias_(case, "partition_key", quoted=True), exp.Count(this=exp.Star()))
        .from_(_target(target))
        .where(hit)
        .group_by(exp.Literal.number(1))
    )


@statement(windows=("region",), values=("ranges",), relations=("target", "keys"))
def keys_outside_window_sample(
    params: Params,
    target: Rel,
    keys: Rel,
    key: Sequence[str],
    region: Region,
    ranges: Sequence[tuple[Any, Any]] = (),
    limit: int = 5,
) -> exp.Expr:
    """Existing rows outside the window whose key the batch also holds."""
    hit = _key_in(params, keys, key, _pairs(ranges))
    return (
        exp.select("t.*")
        .from_(_target(target))
        .where(exp.and_(hit, exp.not_(_region(params, region, "t"))))
        .limit(int(limit))
    )


@statement(windows=("region",), relations=("target",))
def select_window(
    params: Params,
    target: Rel,
    names: Sequence[str] | None,
    region: Region,
    order_by: Sequence[str] = (),
    nothing: bool = False,
) -> exp.Expr:
    """The window's rows (the whole table without one), in ``order_by`` order when given."""
    selected = columns(names) if names is not None else [exp.Star()]
    tree = exp.select(*selected).from_(relation(target))
    if nothing:
        tree = tree.where(exp.false())
    elif region:
        tree = tree.where(_region(params, region))
    if order_by:
        tree = tree.order_by(*terms(order_by))
    return tree


@statement(windows=("region",), relations=("target", "keys"))
def rows_without_keys(
    params: Params,
    target: Rel,
    names: Sequence[str],
    keys: Rel,
    key: Sequence[str],
    region: Region,
) -> exp.Expr:
    """The window's rows whose key ``keys`` does not hold: those an upsert keeps."""
    same = exp.and_(
        *[
            exp.EQ(this=k, expression=t)
            for k, t in zip(columns(key, "k"), columns(key, "t"), strict=True)
        ]
    )
    held = exp.Exists(
        this=exp.select(exp.Literal.number(1))
        .from_(relation(keys).as_("k", quoted=False))
        .where(same)
    )
    condition = exp.not_(held)
    if region:
        condition = exp.and_(_region(params, region, "t"), condition)
    return exp.select(*columns(names, "t")).from_(_target(target)).where(condition)


def rounded_out_of_window(
    source: Rel,
    name: str,
    digits: int,
    spans: Sequence[tuple[int, int]],
    aware: bool,
    limit: int = 5,
) -> Statement:
    """Rows inside the window as sent that rounding to ``digits`` fractional digits moves out.

    Values and ``spans`` are compared as nanoseconds since the epoch (naive values as if UTC,
    as their bounds are), rounded half away from zero. Columns returned: ``batch_value,
    stored_value, rows`` (``rows`` counts them all), the values as text so nanoseconds survive.
    DuckDB's functions (``epoch_ns``, ``make_timestamp``): the evaluator's dialect only.
    """
    c = column(validate_identifier(name, "partition column")).sql("duckdb")
    ns, step = f"epoch_ns({c})", 10 ** (9 - digits)
    half = step // 2
    stored = (
        f"(CASE WHEN {ns} >= 0 THEN ({ns} + {half}) // {step} * {step}"
        f" ELSE -((-{ns} + {half}) // {step} * {step}) END)"
    )
    params: list[Any] = []

    def within(expression: str) -> str:
        parts = []
        for start, end in spans:
            params.extend([start, end])
            parts.append(f"({expression} >= ${len(params) - 1} AND {expression} < ${len(params)})")
        return "(" + " OR ".join(parts) + ")"

    inside, stays = within(ns), within(stored)
    # An aware value reads as text in the evaluator's zone: shown from its instant, in UTC.
    zone = " || '+00'" if aware else ""
    shown = (
        f"CAST(make_timestamp({ns} // 1000) AS VARCHAR){zone}" if aware else f"CAST({c} AS VARCHAR)"
    )
    return Statement(
        f"SELECT {shown} AS batch_value,"
        f" CAST(make_timestamp({stored} // 1000) AS VARCHAR){zone} AS stored_value,"
        f" count(*) OVER () AS rows FROM {relation(source).sql('duckdb')} WHERE {c} IS NOT NULL"
        f" AND {inside} AND NOT {stays} ORDER BY {c} LIMIT {int(limit)}",
        params,
    )


def boxes(cells: Sequence[Cell]) -> Region:
    """The region a range's cells cover."""
    return tuple(b for _, b in cells)


__all__ += ["Box", "Rel", "relation"]
