"""``partition_expr`` as an SQL expression over the batch's columns (``CAST(time AS DATE)``).

dagster-duckdb takes any SQL text there and pastes it into its DELETE. Here an expression is
parsed with sqlglot in the engine's dialect and accepted only when it is a pure, deterministic
scalar expression over the batch's own columns: column references, literals, casts, arithmetic
and a list of functions whose value depends on their arguments alone. It is kept as canonical
text (DuckDB's spelling, every identifier quoted), so settings and windows stay plain, hashable
strings; :func:`idem_assets.lib.sql.predicates.term` turns it back into a tree and renders it in
each engine's dialect, cast to its result type, so the guards (on the staged batch) and the
engine (in its delete, count and load) compare the same value with the window's bounds.

Anything else is refused when the settings are resolved, with the change that works: the
expression to write, or the column to compute in the asset and the metadata naming it.
"""

from collections.abc import Callable
from functools import lru_cache
from typing import Literal

import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from idem_assets.lib.model.errors import ConfigurationError, InvalidIdentifierError
from idem_assets.lib.model.identifiers import validate_identifier

#: The dialect canonical text is spelt in: the guards' evaluator is DuckDB.
CANONICAL = "duckdb"

#: What a dimension's expression must give: a DATE or TIMESTAMP for a time dimension, a key
#: (text, or an integer) for a static or dynamic one.
Kind = Literal["time", "category"]

#: The library's own names (``idem-day``) are columns, though not plain identifiers.
_OWN_PREFIX = "idem-"

#: Nodes an accepted expression may hold: each gives the same value for the same arguments on
#: every engine this library renders it for.
_PURE: tuple[type[exp.Expr], ...] = (
    exp.Column,
    exp.Identifier,
    exp.Literal,
    exp.Boolean,
    exp.Null,
    exp.Paren,
    exp.Neg,
    exp.Cast,
    exp.DataType,
    exp.DataTypeParam,
    exp.Var,
    exp.Add,
    exp.Sub,
    exp.Mul,
    exp.Div,
    exp.IntDiv,
    exp.Mod,
    exp.DPipe,
    exp.Concat,
    exp.EQ,
    exp.NEQ,
    exp.GT,
    exp.GTE,
    exp.LT,
    exp.LTE,
    exp.And,
    exp.Or,
    exp.Not,
    exp.Is,
    exp.Case,
    exp.If,
    exp.Coalesce,
    exp.StrToTime,
    exp.StrToDate,
    exp.TimeStrToTime,
    exp.TimeStrToDate,
    exp.TsOrDsToDate,
    exp.UnixToTime,
    exp.Date,
    exp.DateTrunc,
    exp.TimestampTrunc,
    exp.TimeToStr,
    exp.Extract,
    exp.Year,
    exp.Month,
    exp.Day,
    exp.Lower,
    exp.Upper,
    exp.Trim,
    exp.Substring,
    exp.Left,
    exp.Right,
    exp.Abs,
    exp.Floor,
    exp.Ceil,
)

#: Values that differ between two runs of the same batch.
_VOLATILE: tuple[type[exp.Expr], ...] = (
    exp.CurrentDate,
    exp.CurrentTimestamp,
    exp.CurrentTime,
    exp.CurrentDatetime,
    exp.CurrentUser,
    exp.Rand,
    exp.Randn,
    exp.Uuid,
)
_VOLATILE_NAMES = frozenset(
    {
        "now",
        "random",
        "uuid",
        "gen_random_uuid",
        "nextval",
        "currval",
        "setseed",
        "getvariable",
        "current_setting",
        "clock_timestamp",
        "statement_timestamp",
        "transaction_timestamp",
        "timeofday",
        "current_schema",
        "current_database",
        "txid_current",
    }
)

#: Types a cast inside an expression may name: each is spelt alike on DuckDB and PostgreSQL.
_CASTABLE = frozenset(
    {
        exp.DataType.Type.DATE,
        exp.DataType.Type.TIMESTAMP,
        exp.DataType.Type.DATETIME,
        exp.DataType.Type.TEXT,
        exp.DataType.Type.VARCHAR,
        exp.DataType.Type.CHAR,
        exp.DataType.Type.SMALLINT,
        exp.DataType.Type.INT,
        exp.DataType.Type.BIGINT,
        exp.DataType.Type.DOUBLE,
        exp.DataType.Type.FLOAT,
        exp.DataType.Type.DECIMAL,
    }
)
_ZONED = frozenset({exp.DataType.Type.TIMESTAMPTZ, exp.DataType.Type.TIMESTAMPLTZ})
_TEXT = frozenset({exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR, exp.DataType.Type.CHAR})
_INTEGER = frozenset({exp.DataType.Type.SMALLINT, exp.DataType.Type.INT, exp.DataType.Type.BIGINT})

#: The Arrow type each result is compared as, and the SQL type that casts it so on every engine.
DATE = pa.date32()
TIMESTAMP = pa.timestamp("us")
AWARE = pa.timestamp("us", tz="UTC")
TEXT = pa.string()
INTEGER = pa.int64()


def is_expression(term: str) -> bool:
    """Whether a partition term is an expression (a column is a plain or the library's name)."""
    if term.startswith(_OWN_PREFIX):
        return False
    try:
        validate_identifier(term, "column")
    except InvalidIdentifierError:
        return True
    return False


def resolve(
    value: str, asset: str, what: str, dialect: str | None, kind: Kind, engine: str = ""
) -> str:
    """A ``partition_expr`` term: a validated column name, or an accepted expression's text.

    ``dialect`` is the engine's sqlglot dialect the expression is written in; ``None`` when the
    engine cannot scope a write by an expression (``engine`` names it), which refuses one.
    """
    if not is_expression(value):
        return value
    tree = _parse(value, asset, what, dialect or CANONICAL)
    if isinstance(tree, exp.Column) and not tree.table:
        # A quoted name ("Time") is a column, as the engine resolves it.
        return validate_identifier(tree.name, f"Asset '{asset}': column in {what}")
    if dialect is None:
        raise ConfigurationError(_unsupported(value, tree, asset, what, engine))
    _refuse_impure(tree, value, asset, what)
    found = _result_type(tree)
    wanted = (DATE, TIMESTAMP, AWARE) if kind == "time" else (TEXT, INTEGER)
    if found not in wanted:
        raise ConfigurationError(_untyped(value, tree, asset, what, kind, found))
    return canonical(tree)


def canonical(tree: exp.Expr) -> str:
    """The expression's canonical text: DuckDB's spelling, every identifier quoted."""
    return tree.sql(dialect=CANONICAL, identify=True)


@lru_cache(maxsize=256)
def parsed(term: str) -> exp.Expr:
    """A term's tree, checked again (the builder never renders text it has not validated).

    Raises :class:`ConfigurationError` for anything :func:`resolve` would refuse.
    """
    tree = _parse(term, "(unnamed)", "partition_expr", CANONICAL)
    _refuse_impure(tree, term, "(unnamed)", "partition_expr")
    return tree


def result_type(term: str) -> pa.DataType:
    """The Arrow type an expression term's values are compared as (the window's bounds' type)."""
    found = _result_type(parsed(term))
    if found is None:
        raise ConfigurationError(
            f"partition_expr {term!r} has no result type this library can tell; wrap it in a"
            " cast, e.g. CAST(... AS DATE)."
        )
    return found


def sql_type(kind: pa.DataType) -> exp.DataType:
    """The SQL type that casts a result to ``kind`` on every engine."""
    names = {DATE: "DATE", TIMESTAMP: "TIMESTAMP", AWARE: "TIMESTAMPTZ", TEXT: "TEXT"}
    return exp.DataType.build(names.get(kind, "BIGINT"))


def inputs(term: str) -> tuple[str, ...]:
    """The batch columns a term reads: the column itself, or each the expression names."""
    if not is_expression(term):
        return (term,)
    return tuple(dict.fromkeys(c.name for c in parsed(term).find_all(exp.Column)))


def respelt(term: str, spelling: Callable[[str], str]) -> str:
    """The term with each column it reads spelt by ``spelling`` (as the table stores it)."""
    if not is_expression(term):
        return spelling(term)

    def rename(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column):
            return exp.column(spelling(node.name), quoted=True)
        return node

    return canonical(parsed(term).transform(rename, copy=True))


def _migration(tree: exp.Expr) -> tuple[str, str]:
    """The column to compute in the asset instead of an expression, and the pandas that does.

    ``CAST(time AS DATE)`` -> ``time_date``, ``pd.to_datetime(df['time']).dt.date``.
    """
    used = sorted({c.name for c in tree.find_all(exp.Column)}) or ["time"]
    source = used[0]
    while isinstance(tree, exp.Paren):
        tree = tree.this
    if _result_type(tree) in (TEXT, INTEGER):
        column = f"df[{source!r}]"
        if isinstance(tree, exp.Lower | exp.Upper):
            code = f"{column}.str.{type(tree).__name__.lower()}()"
        elif isinstance(tree, exp.Trim):
            code = f"{column}.str.strip()"
        elif _result_type(tree) == INTEGER:
            code = f"{column}.astype('int64')"
        else:
            code = f"{column}.astype(str)"
        return f"{source}_key", code
    if isinstance(tree, exp.Cast) and tree.to.is_type(exp.DataType.Type.DATE):
        return f"{source}_date", f"pd.to_datetime(df[{source!r}]).dt.date"
    if isinstance(tree, exp.StrToTime | exp.StrToDate) and tree.args.get("format") is not None:
        fmt = tree.args["format"].name
        return f"{source}_at", f"pd.to_datetime(df[{source!r}], format={fmt!r})"
    if isinstance(tree, exp.UnixToTime):
        return f"{source}_at", f"pd.to_datetime(df[{source!r}].astype('int64'), unit='s', utc=True)"
    return f"{source}_at", f"pd.to_datetime(df[{source!r}])"


def compute_instead(term: str) -> str:
    """The fix that needs no expression: the column to compute in the asset, the metadata."""
    try:
        tree = sqlglot.parse_one(term, dialect=CANONICAL)
    except SqlglotError:
        tree = exp.column("time")
    return _computed(tree)


def _computed(tree: exp.Expr) -> str:
    new, code = _migration(tree)
    return (
        f"compute the column in the asset, df[{new!r}] = {code} (pandas), and name it:"
        f" metadata={{'partition_expr': {new!r}}} (for a dg.MultiPartitionsDefinition, that"
        " dimension's entry)"
    )


def _parse(value: str, asset: str, what: str, dialect: str) -> exp.Expr:
    try:
        return sqlglot.parse_one(value, dialect=dialect)
    except SqlglotError as exc:
        errors = getattr(exc, "errors", None)
        problem = errors[0].get("description", "") if errors else str(exc).splitlines()[0]
        raise InvalidIdentifierError(
            f"Asset '{asset}': {what} {value!r} is not a plain identifier, nor an SQL"
            f" expression ({dialect}'s dialect: {problem}). Use letters, digits and underscores"
            " only for a column name (letters of any script), starting with a letter or"
            " underscore."
            " Nothing was changed. Fix: name the column that places each row in its partition,"
            " e.g. metadata={'partition_expr': 'pickup_at'}, or write one expression over the"
            " batch's columns, e.g. 'CAST(time AS DATE)'."
        ) from None


def _refuse_impure(tree: exp.Expr, value: str, asset: str, what: str) -> None:
    """Refuse anything but a pure, deterministic scalar expression over plain column names."""
    for node in tree.walk():
        problem = _impurity(node)
        if problem is not None:
            raise ConfigurationError(
                f"Refused: asset '{asset}': {what} is the SQL expression {value!r}, and"
                f" {problem}. The guards and the window's delete must place every row in the"
                " same partition on every run, so the expression may read only the row's own"
                " columns, through casts, arithmetic and functions whose value depends on their"
                " arguments alone. Nothing was changed. Fix: write such an expression, e.g."
                f" 'CAST(time AS DATE)', or {_computed(tree)}."
            )


def _impurity(node: exp.Expr) -> str | None:
    """Why ``node`` cannot be part of a partition expression (``None``: it can)."""
    spelt = node.sql(dialect=CANONICAL)
    if isinstance(node, exp.Query | exp.Subquery | exp.Block | exp.Exists):
        return f"{spelt!r} is a query or a statement, not one row's value"
    if isinstance(node, exp.AggFunc):
        return f"{spelt!r} is an aggregate, a value of many rows"
    if isinstance(node, exp.Window):
        return f"{spelt!r} is a window function, whose value depends on other rows"
    name = node.name.lower() if isinstance(node, exp.Anonymous) else ""
    if isinstance(node, _VOLATILE) or name in _VOLATILE_NAMES:
        return f"{spelt!r} gives another value on every run"
    if isinstance(node, exp.Placeholder | exp.Parameter | exp.SessionParameter):
        return f"{spelt!r} is a parameter, not a column of the batch"
    if isinstance(node, exp.Star):
        return "'*' is every column, not one value"
    if isinstance(node, exp.Column):
        if node.table or node.args.get("db") or node.args.get("catalog"):
            return f"{spelt!r} names a table; a partition expression reads the row's own columns"
        validate_identifier(node.name, "column in partition_expr")
        return None
    zoned_parts = exp.Cast | exp.DateTrunc | exp.TimestampTrunc | exp.TimeToStr | exp.Extract
    if isinstance(node, zoned_parts | exp.Year | exp.Month | exp.Day):
        # A date, hour or text of an instant is the session's TimeZone's: it differs between
        # engines and connections.
        argument = node.args.get("expression") if isinstance(node, exp.Extract) else node.this
        if isinstance(argument, exp.Expr) and _result_type(argument) == AWARE:
            return (
                f"{spelt!r} reads a date or a time of day out of an instant, which depends on"
                " the session's TimeZone setting, which differs between engines and connections"
            )
    if isinstance(node, exp.Cast) and isinstance(node.to, exp.DataType):
        kind = node.to.this
        if kind in _ZONED:
            return (
                f"{spelt!r} makes a timestamp with time zone, whose value depends on the"
                " session's TimeZone setting, which differs between engines and connections"
            )
        if kind not in _CASTABLE:
            return f"{spelt!r} casts to {node.to.sql(CANONICAL)}, which not every engine spells"
        return None
    if isinstance(node, exp.Anonymous):
        return (
            f"{spelt!r} calls {node.name}(), which this library does not know to be"
            " deterministic and spelt alike on every engine"
        )
    if not isinstance(node, _PURE):
        return f"{spelt!r} ({type(node).__name__}) is not a pure scalar expression"
    return None


def _result_type(tree: exp.Expr) -> pa.DataType | None:
    """The Arrow type the expression gives, where its outermost node says it."""
    while isinstance(tree, exp.Paren):
        tree = tree.this
    if isinstance(tree, exp.Cast):
        kind = tree.to.this
        if kind == exp.DataType.Type.DATE:
            return DATE
        if kind in (exp.DataType.Type.TIMESTAMP, exp.DataType.Type.DATETIME):
            return TIMESTAMP
        if kind in _TEXT:
            return TEXT
        return INTEGER if kind in _INTEGER else None
    if isinstance(tree, exp.StrToDate | exp.TsOrDsToDate | exp.TimeStrToDate | exp.Date):
        return DATE
    if isinstance(tree, exp.StrToTime):
        fmt = tree.args.get("format")
        zoned = fmt is not None and ("%z" in fmt.name or "%Z" in fmt.name)
        return AWARE if zoned or tree.args.get("zone") is not None else TIMESTAMP
    if isinstance(tree, exp.TimeStrToTime):
        return AWARE if tree.args.get("zone") is not None else TIMESTAMP
    if isinstance(tree, exp.UnixToTime):
        # Seconds since the epoch are an instant: DuckDB and PostgreSQL give TIMESTAMPTZ.
        return AWARE
    if isinstance(tree, exp.DateTrunc | exp.TimestampTrunc):
        return _result_type(tree.this)
    if isinstance(tree, exp.Lower | exp.Upper | exp.Trim | exp.Substring | exp.Left | exp.Right):
        return TEXT
    if isinstance(tree, exp.DPipe | exp.Concat | exp.TimeToStr):
        return TEXT
    if isinstance(tree, exp.Extract | exp.Year | exp.Month | exp.Day):
        return INTEGER
    if isinstance(tree, exp.Literal):
        return TEXT if tree.is_string else INTEGER if tree.is_int else None
    if isinstance(tree, exp.Case | exp.If | exp.Coalesce):
        found = {_result_type(b) for b in _branches(tree)} - {None}
        return found.pop() if len(found) == 1 else None
    return None


def _branches(tree: exp.Expr) -> list[exp.Expr]:
    """The values a CASE, IF or COALESCE may give."""
    if isinstance(tree, exp.Coalesce):
        found = [tree.this, *tree.expressions]
    elif isinstance(tree, exp.If):
        found = [tree.args.get("true"), tree.args.get("false")]
    else:
        found = [w.args.get("true") for w in tree.args.get("ifs") or []]
        found.append(tree.args.get("default"))
    return [b for b in found if isinstance(b, exp.Expr)]


def _unsupported(value: str, tree: exp.Expr, asset: str, what: str, engine: str) -> str:
    return (
        f"Refused: asset '{asset}': {what} is the SQL expression {value!r}, but"
        f" {engine or 'this engine'} scopes a write by the stored partition column itself (its"
        " files are laid out and pruned by that column), so it cannot evaluate an expression"
        f" for the window. Nothing was changed. Fix: {_computed(tree)}."
    )


def refuse_unsupported(term: str, asset: str, engine: str) -> None:
    """Refuse an expression term for an engine that cannot evaluate one (its capability)."""
    tree = parsed(term)
    raise ConfigurationError(_unsupported(term, tree, asset, "metadata 'partition_expr'", engine))


def _untyped(
    value: str, tree: exp.Expr, asset: str, what: str, kind: Kind, found: pa.DataType | None
) -> str:
    if kind == "time":
        need, cast = "a DATE or TIMESTAMP", f"CAST({value} AS DATE)"
    else:
        need, cast = "a partition key (text, or an integer)", f"CAST({value} AS VARCHAR)"
    gives = f"gives {found}" if found is not None else "has no result type this library can tell"
    return (
        f"Refused: asset '{asset}': {what} is the SQL expression {value!r}, which {gives};"
        f" the window is compared with {need}. Nothing was changed. Fix: say the type with a"
        f" cast, e.g. {cast!r}, or {_computed(tree)}."
    )
