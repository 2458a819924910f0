"""Which table column each batch column is stored in, and in which DuckDB type.

A publish reads the batch through one staged relation already cast to the stored types, so every
guard judges the values exactly as they will be stored. This module decides those casts: names
match the way DuckDB matches them (without regard to case), a cast that cannot lose a value is
made silently, one that can lose values only on some inputs is checked on the batch, and any
other type change is refused with the ``ALTER TABLE`` that makes it.
"""

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import duckdb

from idem_assets.lib.errors import SchemaMismatchError
from idem_assets.lib.identifiers import quote, validate_identifier
from idem_assets.lib.settings import WriteSettings

Conversion = Literal["same", "cast", "checked"]

_SIGNED = ["TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT"]
_UNSIGNED = ["UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT"]
#: Decimal digits an integer type needs, for widening into DECIMAL(p, s).
_INTEGER_DIGITS = {
    "TINYINT": 3,
    "SMALLINT": 5,
    "INTEGER": 10,
    "BIGINT": 19,
    "HUGEINT": 39,
    "UTINYINT": 3,
    "USMALLINT": 5,
    "UINTEGER": 10,
    "UBIGINT": 20,
}
#: Integer types whose every value a float type holds exactly (24 and 53 bits of mantissa); the
#: wider integers are checked value by value.
_EXACT_IN_FLOAT = {
    "FLOAT": {"TINYINT", "SMALLINT", "UTINYINT", "USMALLINT"},
    "DOUBLE": {"TINYINT", "SMALLINT", "INTEGER", "UTINYINT", "USMALLINT", "UINTEGER"},
}
TIMESTAMPS = {"TIMESTAMP", "TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP_NS"}
# DuckDB 2 reads a pandas tz-aware column (nanoseconds) as TIMESTAMPTZ_NS.
TZ_TIMESTAMPS = {"TIMESTAMP WITH TIME ZONE", "TIMESTAMPTZ", "TIMESTAMPTZ_NS"}
_UNTYPED = {'"NULL"', "NULL"}
#: The type a new table stores: pandas hands DuckDB nanosecond timestamps; store microseconds,
#: DuckDB's native precision, so later Arrow batches and SQL literals compare without casts.
_NATIVE = {
    "TIMESTAMP_S": "TIMESTAMP",
    "TIMESTAMP_MS": "TIMESTAMP",
    "TIMESTAMP_NS": "TIMESTAMP",
    "TIMESTAMPTZ_NS": "TIMESTAMP WITH TIME ZONE",
}
#: pandas' name for the unit a timestamp type rounds to.
FLOOR_UNIT = {
    "TIMESTAMP": "us",
    "TIMESTAMP WITH TIME ZONE": "us",
    "TIMESTAMP_MS": "ms",
    "TIMESTAMP_S": "s",
}
_DECIMAL = re.compile(r"^DECIMAL\((\d+),(\d+)\)$")


@functools.cache
def _reserved_words() -> frozenset[str]:
    with duckdb.connect() as conn:
        rows = conn.execute(
            "SELECT keyword_name FROM duckdb_keywords() WHERE keyword_category = 'reserved'"
        ).fetchall()
    return frozenset(r[0].lower() for r in rows)


def sql_name(name: str) -> str:
    """``name`` as a statement for the user to run spells it: quoted only where it must be."""
    return quote(name) if name.lower() in _reserved_words() else name


def is_timestamp(column_type: str) -> bool:
    """True for every naive or time-zone-aware DuckDB timestamp type."""
    return column_type in TIMESTAMPS or column_type in TZ_TIMESTAMPS


def native(column_type: str) -> str:
    """The type a new table stores for a batch column of ``column_type``."""
    return _NATIVE.get(column_type, column_type)


def _digits(column_type: str) -> tuple[int, int] | None:
    """Digits before and after the point that ``column_type`` holds exactly."""
    if column_type in _INTEGER_DIGITS:
        return _INTEGER_DIGITS[column_type], 0
    match = _DECIMAL.match(column_type)
    if match:
        precision, scale = int(match[1]), int(match[2])
        return precision - scale, scale
    return None


def _widens_integer(batch_type: str, stored_type: str) -> bool:
    for family in (_SIGNED, _UNSIGNED):
        if batch_type in family and stored_type in family:
            return family.index(batch_type) <= family.index(stored_type)
    # UTINYINT fits SMALLINT, USMALLINT fits INTEGER, and so on.
    return (
        batch_type in _UNSIGNED
        and stored_type in _SIGNED
        and _SIGNED.index(stored_type) > _UNSIGNED.index(batch_type)
    )


def conversion(batch_type: str, stored_type: str) -> Conversion | None:
    """How a batch column reaches a table column; ``None`` when the change may lose values.

    ``cast`` never changes a value, except timestamps, which round to the column's unit (the
    guards then judge the rounded values); ``checked`` holds for most values and is verified on
    the batch (integers wider than a float's mantissa).
    """
    if batch_type == stored_type:
        return "same"
    if batch_type in _UNTYPED:
        return "cast"
    for family in (TIMESTAMPS, TZ_TIMESTAMPS):
        if batch_type in family and stored_type in family:
            return "cast"
    if _widens_integer(batch_type, stored_type):
        return "cast"
    if batch_type == "FLOAT" and stored_type == "DOUBLE":
        return "cast"
    if batch_type in _INTEGER_DIGITS and stored_type in _EXACT_IN_FLOAT:
        return "cast" if batch_type in _EXACT_IN_FLOAT[stored_type] else "checked"
    have, want = _digits(batch_type), _digits(stored_type)
    if have and want and _DECIMAL.match(stored_type):
        return "cast" if want[0] >= have[0] and want[1] >= have[1] else None
    return None


def cast(expression: str, batch_type: str, stored_type: str) -> str:
    """SQL that casts ``expression`` from ``batch_type`` to ``stored_type``."""
    if batch_type == stored_type:
        return expression
    if batch_type in TIMESTAMPS and "TIMESTAMP" not in (batch_type, stored_type):
        # DuckDB casts between seconds, milliseconds and nanoseconds only through microseconds.
        expression = f"CAST({expression} AS TIMESTAMP)"
    return f"CAST({expression} AS {stored_type})"


@dataclass(frozen=True)
class StagedColumn:
    """One batch column and the table column it is stored in."""

    name: str
    type: str
    stored_name: str
    stored_type: str
    conversion: Conversion

    @property
    def stored_expression(self) -> str:
        """The batch value as it will be stored."""
        return cast(quote(self.name), self.type, self.stored_type)

    def select(self) -> str:
        """The column of the staged relation: cast to the stored type, named as stored."""
        return f"{self.stored_expression} AS {quote(self.stored_name)}"


def refuse_repeated_names(names: Sequence[str], where: str) -> None:
    """Refuse a batch holding one column name twice, compared as DuckDB compares names."""
    lowered = [n.lower() for n in names]
    repeated = sorted({n for n in names if lowered.count(n.lower()) > 1})
    if repeated:
        # DuckDB would rename the second copy (fare_1) and store it as a column of its own.
        by_case = (
            ", which DuckDB takes for one name: it compares names without regard to case"
            if len({n.lower() for n in repeated}) < len(repeated)
            else ""
        )
        raise SchemaMismatchError(
            f"Refused to write {where}: the batch has more than one column named {repeated}"
            f"{by_case}. Nothing was changed. Fix: drop or rename the duplicates (e.g. after a"
            " join, select the columns you mean to keep)."
        )


def stage_columns(
    settings: WriteSettings,
    where: str,
    batch_cols: dict[str, str],
    table_cols: dict[str, str] | None,
) -> list[StagedColumn]:
    """Match the batch to the table (or to the table it creates), or refuse it."""
    for c in batch_cols:
        validate_identifier(c, f"Refused to write {where}: batch column")
    by_name = {c.lower(): c for c in batch_cols}
    needed = [settings.partition_expr] if settings.partition_expr else []
    needed += list(settings.primary_key) + list(settings.dedupe_order_by)
    absent = [c for c in dict.fromkeys(needed) if c.lower() not in by_name]
    if absent:
        raise SchemaMismatchError(
            f"Refused to write {where}: the batch has no column(s) {absent}, which the asset's"
            f" metadata names (partition_expr/primary_key/dedupe_order_by). Batch columns:"
            f" {list(batch_cols)}. Fix: add the column(s) to the batch, or correct the metadata."
        )
    if settings.partition_expr:
        ptype = batch_cols[by_name[settings.partition_expr.lower()]]
        if ptype != "DATE" and not is_timestamp(ptype):
            raise SchemaMismatchError(
                f"Refused to write {where}: partition column '{settings.partition_expr}' is"
                f" {ptype}, not DATE or TIMESTAMP, so window bounds would compare as text. Fix:"
                f" convert it, e.g. df['{settings.partition_expr}'] ="
                f" pd.to_datetime(df['{settings.partition_expr}'])."
            )
    if table_cols is None:
        target = f"{settings.schema}.{settings.table}"
        _refuse_untyped(where, target, batch_cols)
        return [
            StagedColumn(c, t, c, native(t), "same" if native(t) == t else "cast")
            for c, t in batch_cols.items()
        ]
    table_by_name = {c.lower(): c for c in table_cols}
    missing = [c for c in table_cols if c.lower() not in by_name]
    extra = [c for c in batch_cols if c.lower() not in table_by_name]
    staged, changed = [], []
    for c, t in batch_cols.items():
        stored = table_by_name.get(c.lower())
        if stored is None:
            continue
        how = conversion(t, table_cols[stored])
        if how is None:
            changed.append((stored, table_cols[stored], t))
        else:
            staged.append(StagedColumn(c, t, stored, table_cols[stored], how))
    if missing or extra or changed:
        target = f"{sql_name(settings.schema)}.{sql_name(settings.table)}"
        _refuse_mismatch(where, target, batch_cols, missing, extra, changed)
    return staged


def _refuse_untyped(where: str, target: str, batch_cols: dict[str, str]) -> None:
    # A column whose every value is None has no type; the table would keep a "NULL" column
    # that no later batch with real values fits.
    untyped = [c for c, t in batch_cols.items() if t in _UNTYPED]
    if untyped:
        raise SchemaMismatchError(
            f"Refused to write {where}: column(s) {untyped} hold only NULL and have no type,"
            f" so table {target} cannot be created from this batch."
            " Nothing was changed. Fix: give the column a type, e.g."
            f" df['{untyped[0]}'] = df['{untyped[0]}'].astype('float64'), or build the Arrow"
            " table with an explicit schema."
        )


def _refuse_mismatch(
    where: str,
    target: str,
    batch_cols: dict[str, str],
    missing: list[str],
    extra: list[str],
    changed: list[tuple[str, str, str]],
) -> None:
    problems, statements = [], []
    if missing:
        problems.append(f"missing columns {missing}")
        statements += [f"ALTER TABLE {target} DROP COLUMN {sql_name(c)}" for c in missing]
    if extra:
        problems.append(f"extra columns {extra}")
        statements += [
            f"ALTER TABLE {target} ADD COLUMN {sql_name(c)} {native(batch_cols[c])}" for c in extra
        ]
    if changed:
        problems.append(
            "types that cannot hold every batch value ["
            + "; ".join(f"{c}: table {old}, batch {new}" for c, old, new in changed)
            + "]"
        )
        statements += [
            f"ALTER TABLE {target} ALTER COLUMN {sql_name(c)} TYPE {native(new)}"
            for c, _, new in changed
        ]
    tz_hint = (
        " A TIMESTAMP vs TIMESTAMP WITH TIME ZONE difference means one side is timezone-aware:"
        " make both naive (tz_localize(None)) or both aware."
        if any("TIME ZONE" in old + new or "TIMESTAMPTZ" in old + new for _, old, new in changed)
        else ""
    )
    raise SchemaMismatchError(
        f"Refused to write {where}: the batch does not match table {target}: "
        + ", ".join(problems)
        + ". Nothing was changed. Fix: make the batch produce the table's columns and types;"
        " or, for an intended schema change, migrate the table first, then rerun: "
        + "; ".join(statements)
        + "."
        + tz_hint
    )


def refuse_lossy_values(
    where: str, target: str, column: StagedColumn, lost: int, examples: Sequence[object]
) -> None:
    """Refuse a checked conversion that would change ``lost`` values of ``column``."""
    raise SchemaMismatchError(
        f"Refused to write {where}: {lost} value(s) of '{column.name}' ({column.type}) are not"
        f" exactly representable as {column.stored_type}, the type of {target}."
        f"{column.stored_name}, e.g. {list(examples)}; storing them would change them. Nothing"
        " was changed. Fix: convert the column knowingly, accepting the rounding, e.g."
        f" df['{column.name}'] = df['{column.name}'].astype('float64'); or keep the values"
        " exact in a table of their own type."
    )
