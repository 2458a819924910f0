# pyarrow.compute builds its functions at import time, so a type checker cannot see them.
# pyright: reportAttributeAccessIssue=false
"""Which table column each batch column is stored in, and whether its type fits, on Arrow types.

Every engine stores a batch by the same rules: names match without regard to case, a type change
that cannot lose a value is made silently, one that loses values only on some inputs is checked
value by value on the batch, and any other change is refused with the migration that makes it.
What differs per engine (the type a new table stores, how its DDL spells a type, which names need
quotes) is a :class:`TypeDialect`.

An asset may opt into schema evolution (``metadata={"schema_evolution": ...}``): then
:func:`schema_changes` lists the columns to add and the types to widen, which the backend applies
in the publish's own transaction, and :func:`fit_columns` still refuses whatever would lose a
value (a narrower type, another type, a dropped column).
"""

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any, Literal, Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.compute as pc

from idem_assets.lib.model import expressions
from idem_assets.lib.model.errors import InvalidIdentifierError, SchemaMismatchError
from idem_assets.lib.model.identifiers import validate_identifier
from idem_assets.lib.model.samples import format_sample
from idem_assets.lib.model.settings import WriteSettings

Conversion = Literal["same", "cast", "checked"]


#: Arrow types a Parquet table without unsigned, half-precision, date64 or large/view types
#: stores in the next type that holds every value (Delta Lake and Spark): ``decimal(20, 0)`` is
#: the only one that holds every uint64.
PARQUET_WIDENINGS: dict[pa.DataType, pa.DataType] = {
    pa.uint8(): pa.int16(),
    pa.uint16(): pa.int32(),
    pa.uint32(): pa.int64(),
    pa.uint64(): pa.decimal128(20, 0),
    pa.float16(): pa.float32(),
    pa.date64(): pa.date32(),
    pa.large_string(): pa.string(),
    pa.string_view(): pa.string(),
    pa.large_binary(): pa.binary(),
    pa.binary_view(): pa.binary(),
}


class TypeDialect(Protocol):
    """What one engine decides about types: what it stores, and how its statements spell it."""

    #: The engine's name for messages: "DuckDB", "Postgres", "Delta Lake".
    engine: str

    def stored_type(self, batch_type: pa.DataType) -> pa.DataType:
        """The type a new table stores for a batch column of ``batch_type``."""
        ...

    def type_sql(self, arrow_type: pa.DataType) -> str:
        """The engine's DDL spelling of ``arrow_type``."""
        ...

    def sql_name(self, name: str) -> str:
        """``name`` as a user would type it in a statement: quoted only where it must be."""
        ...


@runtime_checkable
class MigratesInCode(Protocol):
    """A dialect whose engine takes no ``ALTER TABLE``: its migrations are code to run."""

    def migration(
        self,
        missing: Sequence[str],
        extra: Mapping[str, pa.DataType],
        changed: Mapping[str, pa.DataType],
    ) -> str:
        """Code that drops ``missing``, adds ``extra`` and retypes ``changed`` (stored types)."""
        ...


@dataclass(frozen=True)
class SchemaChange:
    """One change a publish makes to its table's schema, because the asset opted into it."""

    action: Literal["add_column", "widen_type"]
    #: The column as the table spells it (a new column as the batch spells it).
    column: str
    #: Its type after the change.
    type: pa.DataType


@dataclass(frozen=True)
class ColumnFit:
    """One batch column and the table column it is stored in."""

    name: str
    type: pa.DataType
    stored_name: str
    stored_type: pa.DataType
    conversion: Conversion


_SIGNED = [pa.int8(), pa.int16(), pa.int32(), pa.int64()]
_UNSIGNED = [pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
#: Decimal digits an integer type needs, for widening into decimal(p, s).
_INTEGER_DIGITS = {
    pa.int8(): 3,
    pa.int16(): 5,
    pa.int32(): 10,
    pa.int64(): 19,
    pa.uint8(): 3,
    pa.uint16(): 5,
    pa.uint32(): 10,
    pa.uint64(): 20,
}
#: Integer types whose every value a float type holds exactly (24 and 53 bits of mantissa); the
#: wider integers are checked value by value.
_EXACT_IN_FLOAT = {
    pa.float32(): {pa.int8(), pa.int16(), pa.uint8(), pa.uint16()},
    pa.float64(): {pa.int8(), pa.int16(), pa.int32(), pa.uint8(), pa.uint16(), pa.uint32()},
}
_TEXT = ({pa.string(), pa.large_string(), pa.string_view()}, {pa.binary(), pa.large_binary()})
#: A timestamp unit's size in nanoseconds, and its name for ``pyarrow.compute.floor_temporal``.
_UNITS = {"s": (10**9, "second"), "ms": (10**6, "millisecond"), "us": (10**3, "microsecond")}


def _is_aware(arrow_type: pa.DataType) -> bool:
    return pa.types.is_timestamp(arrow_type) and arrow_type.tz is not None


def _same(batch_type: pa.DataType, stored_type: pa.DataType) -> bool:
    # An aware timestamp is an instant; its zone only says how to show it.
    if _is_aware(batch_type) and _is_aware(stored_type):
        return batch_type.unit == stored_type.unit
    return batch_type == stored_type


def _digits(arrow_type: pa.DataType) -> tuple[int, int] | None:
    """Digits before and after the point that ``arrow_type`` holds exactly."""
    if arrow_type in _INTEGER_DIGITS:
        return _INTEGER_DIGITS[arrow_type], 0
    if pa.types.is_decimal(arrow_type):
        return arrow_type.precision - arrow_type.scale, arrow_type.scale
    return None


def _widens_integer(batch_type: pa.DataType, stored_type: pa.DataType) -> bool:
    for family in (_SIGNED, _UNSIGNED):
        if batch_type in family and stored_type in family:
            return family.index(batch_type) <= family.index(stored_type)
    # uint8 fits int16, uint16 fits int32, and so on.
    return (
        batch_type in _UNSIGNED
        and stored_type in _SIGNED
        and _SIGNED.index(stored_type) > _UNSIGNED.index(batch_type)
    )


def conversion(batch_type: pa.DataType, stored_type: pa.DataType) -> Conversion | None:
    """How a batch column reaches a table column; ``None`` when the change may lose values.

    ``cast`` never changes a value, except timestamps, which the engine brings to the column's
    unit (the guards then judge the stored values); ``checked`` holds for most values and is
    verified on the batch (integers wider than a float's mantissa).
    """
    if _same(batch_type, stored_type):
        return "same"
    if pa.types.is_null(batch_type):
        return "cast"
    if pa.types.is_timestamp(batch_type) and pa.types.is_timestamp(stored_type):
        return "cast" if _is_aware(batch_type) == _is_aware(stored_type) else None
    if any(batch_type in family and stored_type in family for family in _TEXT):
        return "cast"
    if _widens_integer(batch_type, stored_type):
        return "cast"
    if pa.types.is_floating(batch_type) and pa.types.is_floating(stored_type):
        return "cast" if batch_type.bit_width <= stored_type.bit_width else None
    if batch_type in _INTEGER_DIGITS and stored_type in _EXACT_IN_FLOAT:
        return "cast" if batch_type in _EXACT_IN_FLOAT[stored_type] else "checked"
    have, want = _digits(batch_type), _digits(stored_type)
    if have and want and pa.types.is_decimal(stored_type):
        return "cast" if want[0] >= have[0] and want[1] >= have[1] else None
    return None


def _fit(
    batch_type: pa.DataType, stored_type: pa.DataType, dialect: TypeDialect
) -> Conversion | None:
    how = conversion(batch_type, stored_type)
    if how is None and _same(dialect.stored_type(batch_type), stored_type):
        # Two Arrow spellings of one engine type (a dictionary of strings, date64).
        return "cast"
    return how


def schema_changes(
    settings: WriteSettings,
    where: str,
    batch: pa.Schema,
    table: dict[str, pa.DataType] | None,
    dialect: TypeDialect,
) -> list[SchemaChange]:
    """The columns to add and the types to widen that the asset's ``schema_evolution`` allows.

    A type is widened only where every value the table holds fits the new type unchanged
    (int32 to int64, int32 to double, float to double, decimal(10,2) to decimal(12,2)); nothing
    here changes the table, and what it does not list is left to :func:`fit_columns` to refuse.
    """
    if table is None or settings.schema_evolution == "strict":
        return []
    table_by_name = {c.lower(): c for c in table}
    changes = []
    for field in batch:
        stored = table_by_name.get(field.name.lower())
        if stored is None:
            if settings.adds_columns and not pa.types.is_null(field.type):
                changes.append(
                    SchemaChange("add_column", field.name, dialect.stored_type(field.type))
                )
        elif settings.widens_types and _widening(field.type, table[stored], dialect):
            changes.append(SchemaChange("widen_type", stored, dialect.stored_type(field.type)))
    return changes


def _widening(batch_type: pa.DataType, old: pa.DataType, dialect: TypeDialect) -> bool:
    """True when the column must change type for the batch, and every stored value fits."""
    return (
        _fit(batch_type, old, dialect) is None
        and conversion(old, dialect.stored_type(batch_type)) == "cast"
    )


def evolved(
    table: dict[str, pa.DataType], changes: Sequence[SchemaChange]
) -> dict[str, pa.DataType]:
    """The table's columns and types once ``changes`` are made."""
    after = dict(table)
    for change in changes:
        after[change.column] = change.type
    return after


def change_sql(target: str, change: SchemaChange, dialect: TypeDialect) -> str:
    """The ``ALTER TABLE`` statement that makes ``change`` to ``target`` (a quoted name)."""
    column, spelt = dialect.sql_name(change.column), dialect.type_sql(change.type)
    if change.action == "add_column":
        return f"ALTER TABLE {target} ADD COLUMN {column} {spelt}"
    return f"ALTER TABLE {target} ALTER COLUMN {column} TYPE {spelt}"


def refuse_repeated_names(names: Sequence[str], where: str, engine: str = "DuckDB") -> None:
    """Refuse a batch holding one column name twice, compared without regard to case."""
    lowered = [n.lower() for n in names]
    repeated = sorted({n for n in names if lowered.count(n.lower()) > 1})
    if repeated:
        # The engine would rename the second copy (fare_1) and store it as a column of its own.
        by_case = (
            f", which {engine} takes for one name: it compares names without regard to case"
            if len({n.lower() for n in repeated}) < len(repeated)
            else ""
        )
        raise SchemaMismatchError(
            f"Refused to write {where}: the batch has more than one column named {repeated}"
            f"{by_case}. Nothing was changed. Fix: drop or rename the duplicates (e.g. after a"
            " join, select the columns you mean to keep)."
        )


def fit_columns(
    settings: WriteSettings,
    where: str,
    batch: pa.Schema,
    table: dict[str, pa.DataType] | None,
    dialect: TypeDialect,
) -> list[ColumnFit]:
    """Match the batch to the table (or to the table it creates), or refuse it."""
    batch_cols = {f.name: f.type for f in batch}
    _refuse_unusable(settings, where, batch_cols, dialect)
    if table is None:
        _refuse_untyped(where, f"{settings.schema}.{settings.table}", batch_cols)
        fits = []
        for c, t in batch_cols.items():
            stored = dialect.stored_type(t)
            fits.append(ColumnFit(c, t, c, stored, "same" if _same(t, stored) else "cast"))
        return fits
    by_name = {c.lower() for c in batch_cols}
    table_by_name = {c.lower(): c for c in table}
    missing = [c for c in table if c.lower() not in by_name]
    extra = [c for c in batch_cols if c.lower() not in table_by_name]
    fits, changed = [], []
    for c, t in batch_cols.items():
        stored = table_by_name.get(c.lower())
        if stored is None:
            continue
        how = _fit(t, table[stored], dialect)
        if how is None:
            changed.append((stored, table[stored], t))
        else:
            fits.append(ColumnFit(c, t, stored, table[stored], how))
    if missing or extra or changed:
        _refuse_mismatch(settings, where, dialect, batch_cols, missing, extra, changed)
    return fits


def _refuse_unusable(
    settings: WriteSettings, where: str, batch_cols: dict[str, pa.DataType], dialect: TypeDialect
) -> None:
    """Refuse names no table can have, and absent or untimely columns the metadata names."""
    for c in batch_cols:
        validate_identifier(c, f"Refused to write {where}: batch column")
    for c, t in batch_cols.items():
        if isinstance(t, pa.Decimal256Type):
            _refuse_decimal256(where, c, t)
    by_name = {c.lower(): c for c in batch_cols}
    needed = [c for term in settings.partition_names for c in expressions.inputs(term)]
    needed += list(settings.primary_key) + list(settings.dedupe_order_by)
    absent = [c for c in dict.fromkeys(needed) if c.lower() not in by_name]
    if absent:
        raise SchemaMismatchError(
            f"Refused to write {where}: the batch has no column(s) {absent}, which the asset's"
            f" metadata names (partition_expr/primary_key/dedupe_order_by). Batch columns:"
            f" {list(batch_cols)}. Fix: add the column(s) to the batch, or correct the metadata."
        )
    _refuse_zoned_inputs(settings, where, batch_cols, by_name)
    time = settings.time_column
    # A column with no type (an empty frame's object column) holds no value to misplace: the
    # guards judge such a batch, as empty or as NULL in a partition column.
    untyped = pa.types.is_null
    if time and not expressions.is_expression(time):
        ptype = batch_cols[by_name[time.lower()]]
        if not (pa.types.is_date(ptype) or pa.types.is_timestamp(ptype) or untyped(ptype)):
            raise SchemaMismatchError(
                f"Refused to write {where}: partition column '{time}' is"
                f" {dialect.type_sql(ptype)}, not DATE or TIMESTAMP, so window bounds would"
                f" compare as text. Fix: convert it, e.g. df['{time}'] ="
                f" pd.to_datetime(df['{time}'])."
            )
    for column in settings.partition_names:
        if expressions.is_expression(column):
            # Its result type is fixed by the expression (a cast), whatever it reads.
            continue
        ctype = batch_cols[by_name[column.lower()]]
        text = pa.types.is_string(ctype) or pa.types.is_large_string(ctype)
        if column == time or text or untyped(ctype):
            continue
        if not pa.types.is_integer(ctype):
            raise SchemaMismatchError(
                f"Refused to write {where}: partition column '{column}' holds a static or"
                f" dynamic dimension's values but is {dialect.type_sql(ctype)}; a"
                " partition key is text, so it would match its rows only by a lossy cast."
                f" Nothing was changed. Fix: store the values as text, e.g. df['{column}'] ="
                f" df['{column}'].astype(str) (an integer column works for integer keys)."
            )


def _refuse_zoned_inputs(
    settings: WriteSettings,
    where: str,
    batch_cols: dict[str, pa.DataType],
    by_name: dict[str, str],
) -> None:
    """Refuse a ``partition_expr`` expression reading a timestamp with time zone.

    Turning an instant into a date or a wall-clock time depends on the session's TimeZone,
    which differs between the guards' evaluator, the engine and the next run's connection.
    """
    for term in settings.partition_names:
        if not expressions.is_expression(term):
            continue
        for name in expressions.inputs(term):
            kind = batch_cols[by_name[name.lower()]]
            if pa.types.is_timestamp(kind) and kind.tz is not None:
                raise SchemaMismatchError(
                    f"Refused to write {where}: partition_expr {term} reads '{name}', a"
                    f" timestamp with time zone ({kind}); a date or a wall-clock time made of"
                    " it depends on the session's TimeZone setting, which differs between"
                    " engines and connections, so two runs could place a row in different"
                    " partitions. Nothing was changed. Fix: name the column itself,"
                    f" metadata={{'partition_expr': '{name}'}}: the window then compares"
                    " instants, in the partitions' own time zone."
                )


def _refuse_decimal256(where: str, column: str, decimal: pa.Decimal256Type) -> None:
    """Refuse a decimal256 column: the guards read the batch in DuckDB, which has none."""
    fits = decimal.scale <= 38
    cast = (
        f"batch = batch.set_column(batch.schema.get_field_index('{column}'), '{column}',"
        f" batch['{column}'].cast(pa.decimal128({min(decimal.precision, 38)}, {decimal.scale})))"
    )
    raise SchemaMismatchError(
        f"Refused to write {where}: column '{column}' is decimal256({decimal.precision},"
        f" {decimal.scale}), and the guards judge every batch in DuckDB, which reads decimals of"
        " at most 38 digits, as decimal128 only. Nothing was changed. Fix: "
        + (
            f"cast it to decimal128, which fails rather than rounds if a value has more than 38"
            f" digits: {cast}; else store it as text: df['{column}'] = df['{column}'].astype(str)."
            if fits
            else f"store it as text: df['{column}'] = df['{column}'].astype(str)."
        )
    )


def _refuse_untyped(where: str, target: str, batch_cols: dict[str, pa.DataType]) -> None:
    # A column whose every value is None has no type; the table would keep a NULL-typed column
    # that no later batch with real values fits.
    untyped = [c for c, t in batch_cols.items() if pa.types.is_null(t)]
    if untyped:
        raise SchemaMismatchError(
            f"Refused to write {where}: column(s) {untyped} hold only NULL and have no type,"
            f" so table {target} cannot be created from this batch."
            " Nothing was changed. Fix: give the column a type, e.g."
            f" df['{untyped[0]}'] = df['{untyped[0]}'].astype('float64'), or build the Arrow"
            " table with an explicit schema."
        )


def _refuse_mismatch(
    settings: WriteSettings,
    where: str,
    dialect: TypeDialect,
    batch_cols: dict[str, pa.DataType],
    missing: list[str],
    extra: list[str],
    changed: list[tuple[str, pa.DataType, pa.DataType]],
) -> None:
    target = f"{dialect.sql_name(settings.schema)}.{dialect.sql_name(settings.table)}"
    name, spelt = dialect.sql_name, dialect.type_sql
    problems, statements = [], []
    if missing:
        problems.append(f"missing columns {missing}")
        statements += [f"ALTER TABLE {target} DROP COLUMN {name(c)}" for c in missing]
    if extra:
        problems.append(f"extra columns {extra}")
        statements += [
            f"ALTER TABLE {target} ADD COLUMN {name(c)} {spelt(dialect.stored_type(batch_cols[c]))}"
            for c in extra
        ]
    if changed:
        problems.append(
            "types that cannot hold every batch value ["
            + "; ".join(f"{c}: table {spelt(old)}, batch {spelt(new)}" for c, old, new in changed)
            + "]"
        )
        statements += [
            f"ALTER TABLE {target} ALTER COLUMN {name(c)} TYPE {spelt(dialect.stored_type(new))}"
            + _reading(name(c), old, new, settings.timezone)
            for c, old, new in changed
        ]
    if isinstance(dialect, MigratesInCode):
        statements = [
            dialect.migration(
                missing,
                {c: dialect.stored_type(batch_cols[c]) for c in extra},
                {c: dialect.stored_type(new) for c, _, new in changed},
            )
        ]
    evolution = _evolution_hint(settings, dialect, batch_cols, missing, extra, changed)
    aware = [c for c, old, new in changed if _is_aware(old) or _is_aware(new)]
    tz_hint = (
        " A TIMESTAMP vs TIMESTAMP WITH TIME ZONE difference means one side is timezone-aware:"
        " make both naive, in the partitions' zone (df['{0}'] = df['{0}']"
        ".dt.tz_convert('{1}').dt.tz_localize(None)), or both aware.".format(
            aware[0], settings.timezone
        )
        if aware
        else ""
    )
    raise SchemaMismatchError(
        f"Refused to write {where}: the batch does not match table {target}: "
        + ", ".join(problems)
        + ". Nothing was changed. Fix: make the batch produce the table's columns and types;"
        + evolution
        + " or, for an intended schema change, migrate the table first, then rerun: "
        + "; ".join(statements)
        + "."
        + tz_hint
    )


def _reading(column: str, old: pa.DataType, new: pa.DataType, zone: str) -> str:
    """The ``USING`` clause that keeps every instant when a column gains or loses its zone.

    Without it the conversion reads naive values in the session's time zone (and writes aware
    ones out in it), so a session in another zone would shift every stored value. A naive
    value is wall-clock time in the partitions' ``zone``, as windows read it.
    """
    if (
        pa.types.is_timestamp(old)
        and pa.types.is_timestamp(new)
        and _is_aware(old) != _is_aware(new)
    ):
        return f" USING {column} AT TIME ZONE '{zone}'"
    return ""


def _evolution_hint(
    settings: WriteSettings,
    dialect: TypeDialect,
    batch_cols: dict[str, pa.DataType],
    missing: list[str],
    extra: list[str],
    changed: list[tuple[str, pa.DataType, pa.DataType]],
) -> str:
    """The ``schema_evolution`` value that would make the publish fix it all, when one would."""
    if missing or not (extra or changed):
        # A dropped column loses its values: only the user may drop it.
        return ""
    adds = settings.adds_columns or bool(extra)
    widens = settings.widens_types or bool(changed)
    lossless = all(_widening(new, old, dialect) for _, old, new in changed)
    typed = not any(pa.types.is_null(batch_cols[c]) for c in extra)
    if not (lossless and typed):
        return ""
    value = {
        (True, False): "add_columns",
        (False, True): "widen_types",
        (True, True): "add_columns_and_widen_types",
    }[(adds, widens)]
    return (
        " or let every publish make such changes itself, in its own transaction:"
        f" metadata={{'schema_evolution': '{value}'}};"
    )


def refuse_lossy_values(
    values: Callable[[], Iterator[pa.Table]],
    fits: Sequence[ColumnFit],
    settings: WriteSettings,
    where: str,
    dialect: TypeDialect | None = None,
) -> None:
    """Refuse a checked conversion that would change any value of its column.

    Each value is cast to the stored type and back; one that comes back different would be
    stored changed. ``values`` gives the batch a bounded table at a time (a streamed batch is
    read again only where a conversion needs checking). Types are spelt as ``dialect`` spells
    them (Arrow's names without one).
    """
    checked = [f for f in fits if f.conversion == "checked"]
    if not checked:
        return
    lost: dict[str, tuple[int, list[Any]]] = {f.name: (0, []) for f in checked}
    for chunk in values():
        for fit in checked:
            column = chunk.column(fit.name)
            there = pc.cast(column, fit.stored_type, safe=False)
            back = pc.cast(there, fit.type, safe=False)
            found = column.filter(pc.fill_null(pc.not_equal(column, back), False))
            if len(found):
                count, examples = lost[fit.name]
                smallest = pc.take(found, pc.sort_indices(found)[:3]).to_pylist()
                lost[fit.name] = (count + len(found), sorted([*examples, *smallest])[:3])
    spelt = dialect.type_sql if dialect else str
    for fit in checked:
        count, examples = lost[fit.name]
        if count:
            raise SchemaMismatchError(
                f"Refused to write {where}: {count} value(s) of '{fit.name}'"
                f" ({spelt(fit.type)}) are not exactly representable as"
                f" {spelt(fit.stored_type)}, the type of {settings.schema}.{settings.table}."
                f"{fit.stored_name}, e.g. {examples}; storing them would change them. Nothing"
                " was changed. Fix: convert the column knowingly, accepting the rounding, e.g."
                f" df['{fit.name}'] = df['{fit.name}'].astype('float64'); or keep the values"
                " exact in a table of their own type."
            )


def refuse_cut_names(
    settings: WriteSettings, where: str, columns: Sequence[str], limit: int, engine: str
) -> None:
    """Refuse a schema, table or column name longer than ``limit`` bytes of UTF-8.

    ``engine`` keeps only that many bytes of a name and silently drops the rest, so the write
    would land under another name, and two names alike in their first bytes in one table.
    """
    named = [("schema", settings.schema), ("table", settings.table)]
    for what, name in [*named, *(("column", c) for c in columns)]:
        size = len(name.encode())
        if size <= limit:
            continue
        short = name.encode()[:limit].decode(errors="ignore")
        fix = {
            "schema": f"metadata={{'schema': '{short}'}} (or an IO manager 'schema' or a key"
            " prefix that short)",
            "table": f"an asset key whose last part is at most {limit} bytes, e.g. '{short}'",
            "column": f"df = df.rename(columns={{'{name}': '{short}'}})",
        }[what]
        raise InvalidIdentifierError(
            f"Refused to write {where}: {what} '{name}' is {size} bytes long in UTF-8; {engine}"
            f" keeps at most {limit} bytes of a name and would silently cut it to '{short}', so"
            " the write would land under another name (and two names alike in their first"
            f" {limit} bytes would meet in one). Nothing was changed. Fix: a name of at most"
            f" {limit} bytes (a letter such as 'ü' takes two): {fix}."
        )


def refuse_unstorable_text(
    values: Callable[[], Iterator[pa.Table]],
    fits: Sequence[ColumnFit],
    settings: WriteSettings,
    where: str,
    dialect: TypeDialect,
    lengths: dict[str, tuple[int, str]],
    holds_nul: bool = True,
) -> None:
    """Refuse text the stored column cannot hold: NUL characters, or more characters than fit.

    ``lengths`` maps a stored column to the characters it holds and its type as the engine
    spells it (``character varying(3)``); ``holds_nul`` is False where text cannot hold U+0000.
    ``values`` gives the batch a bounded table at a time; it is read only where a column
    needs the check.
    """
    text = [
        f
        for f in fits
        if pa.types.is_string(f.stored_type)
        and f.type in _TEXT[0]
        and (not holds_nul or f.stored_name in lengths)
    ]
    if not text:
        return
    found = {f.name: _TextFound() for f in text}
    for chunk in values():
        for fit in text:
            found[fit.name].add(chunk, fit, None if holds_nul else "\x00", lengths)
    target = f"{dialect.sql_name(settings.schema)}.{dialect.sql_name(settings.table)}"
    for fit in text:
        seen = found[fit.name]
        if seen.nul:
            raise SchemaMismatchError(
                f"Refused to write {where}: {seen.nul} value(s) of '{fit.name}' hold the"
                f" character U+0000 (NUL), which {dialect.engine} text cannot store."
                " Nothing was changed. Fix: remove it (or replace it) before returning the"
                " batch, e.g."
                f" df['{fit.name}'] = df['{fit.name}'].str.replace('\\x00', '',"
                " regex=False). Sample:\n" + _rows_text(pa.concat_tables(seen.nul_rows))
            )
        if seen.over:
            limit, spelt = lengths[fit.stored_name]
            column = f"{target}.{dialect.sql_name(fit.stored_name)}"
            raise SchemaMismatchError(
                f"Refused to write {where}: {seen.over} value(s) of '{fit.name}' are longer than"
                f" the {limit} characters {column} ({spelt}) holds, e.g. {seen.examples}. Nothing"
                " was changed. Fix: widen the column (no stored value changes), then rerun:"
                f" ALTER TABLE {target} ALTER COLUMN {dialect.sql_name(fit.stored_name)} TYPE"
                f" {_widened(spelt, seen.longest)}; or shorten the values in the batch."
            )


@dataclass
class _TextFound:
    """What the text check found in one column so far."""

    nul: int = 0
    nul_rows: list[pa.Table] = dataclass_field(default_factory=list)
    over: int = 0
    longest: int = 0
    examples: list[Any] = dataclass_field(default_factory=list)

    def add(
        self,
        chunk: pa.Table,
        fit: ColumnFit,
        nul: str | None,
        lengths: dict[str, tuple[int, str]],
    ) -> None:
        values = chunk.column(fit.name)
        if nul is not None:
            hit = pc.fill_null(pc.match_substring(values, nul), False)
            count = pc.sum(hit).as_py() or 0
            if count:
                self.nul += count
                shown = sum(t.num_rows for t in self.nul_rows)
                if shown < 5:
                    self.nul_rows.append(chunk.filter(hit).slice(0, 5 - shown))
        if fit.stored_name not in lengths:
            return
        limit = lengths[fit.stored_name][0]
        size = pc.utf8_length(values)
        over = pc.fill_null(pc.greater(size, limit), False)
        count = pc.sum(over).as_py() or 0
        if count:
            self.over += count
            self.longest = max(self.longest, pc.max(size).as_py() or 0)
            self.examples += values.filter(over).slice(0, 3 - len(self.examples)).to_pylist()


def _widened(spelt: str, length: int) -> str:
    """``character varying(3)`` with room for ``length`` characters."""
    return spelt.split("(", 1)[0] + f"({length})"


def _rows_text(rows: pa.Table) -> str:
    return format_sample(rows.column_names, list(zip(*rows.to_pydict().values(), strict=True)))


@dataclass(frozen=True)
class StoredDigits:
    """What the values of a decimal column of no declared precision need, read from the table."""

    #: Digits before the point of the widest value, and after it of the longest fraction.
    integer: int
    scale: int
    #: Whether every value stored reads back unchanged through a double.
    exact_in_double: bool


def refuse_unreadable_columns(
    settings: WriteSettings,
    where: str,
    batch: pa.Schema,
    unreadable: dict[str, str],
    digits: dict[str, StoredDigits],
    dialect: TypeDialect,
) -> None:
    """Refuse a table holding columns of types the engine cannot exchange as Arrow.

    ``unreadable`` maps each such column to its type as the engine spells it; ``digits`` holds
    the stored values' digits of those of them that are decimals without a declared precision.
    The fix gives each column the type the batch's column is stored as, wide enough to keep
    every value stored now unchanged.
    """
    if not unreadable:
        return
    target = f"{dialect.sql_name(settings.schema)}.{dialect.sql_name(settings.table)}"
    batch_types = {f.name.lower(): f.type for f in batch}
    statements, notes = [], []
    for column in unreadable:
        name, sent = dialect.sql_name(column), batch_types.get(column.lower())
        kind, note = f"text USING {name}::text", ""
        if column in digits:
            kind, note = _decimal_home(column, digits[column], sent, dialect)
        statements.append(f"ALTER TABLE {target} ALTER COLUMN {name} TYPE {kind}")
        notes += [note] if note else []
    named = ", ".join(f"{c} ({t})" for c, t in unreadable.items())
    raise SchemaMismatchError(
        f"Refused to write {where}: table {target} has column(s) {named} of a type"
        f" {dialect.engine} does not exchange as Arrow, so the batch could be neither checked"
        " against them nor read back. Nothing was changed. Fix: give them a type it does (no"
        " value stored now changes), then rerun: " + "; ".join(statements) + "." + "".join(notes)
    )


def _decimal_home(
    column: str, stored: StoredDigits, sent: pa.DataType | None, dialect: TypeDialect
) -> tuple[str, str]:
    """The type a decimal column of no precision takes to hold its values and the batch's."""
    if sent is not None and pa.types.is_floating(sent) and stored.exact_in_double:
        return dialect.type_sql(pa.float64()), ""
    have = _digits(sent) if sent is not None else None
    integer = max(stored.integer, have[0] if have else 0, 1)
    scale = max(stored.scale, have[1] if have else 0)
    if integer + scale > 38:
        # Past 38 digits no Arrow decimal128 holds it: text keeps every value.
        return f"text USING {dialect.sql_name(column)}::text", ""
    kind = dialect.type_sql(pa.decimal128(integer + scale, scale))
    note = ""
    if have is None and sent is not None:
        note = (
            f" The batch's '{column}' must then be decimals too, e.g. pa.array(values,"
            f" pa.decimal128({integer + scale}, {scale}))."
        )
    return kind, note


def stored_batch(batch: pa.Table, fits: Sequence[ColumnFit]) -> pa.Table:
    """The batch renamed to the stored names and cast to the stored types, in Arrow.

    Timestamps are floored to the stored unit: a floor never moves a row across a window bound
    that lies on that unit's grid (rounding would), so an engine storing this table stores
    exactly what the guards judged.
    """
    columns = []
    for fit in fits:
        values = batch.column(fit.name)
        if _coarser(fit.type, fit.stored_type):
            values = pc.floor_temporal(values, unit=_UNITS[fit.stored_type.unit][1])
        if values.type != fit.stored_type:
            # A checked conversion's values were verified by refuse_lossy_values.
            values = pc.cast(values, fit.stored_type, safe=fit.conversion != "checked")
        columns.append(values)
    return pa.Table.from_arrays(columns, names=[fit.stored_name for fit in fits])


def rounded_timestamps(values: pa.ChunkedArray, digits: int) -> pa.ChunkedArray:
    """Microsecond timestamps rounded to ``digits`` fractional digits, half away from zero.

    As PostgreSQL rounds a value stored in ``timestamp(digits)``, so staged values equal stored.
    """
    step = 10 ** (6 - digits)
    micros = pc.cast(values, pa.int64())
    # Integer division of a non-negative number truncates, so this rounds the magnitude.
    magnitude = pc.multiply(pc.divide(pc.add(pc.abs(micros), step // 2), step), step)
    return pc.cast(pc.if_else(pc.less(micros, 0), pc.negate(magnitude), magnitude), values.type)


def _coarser(batch_type: pa.DataType, stored_type: pa.DataType) -> bool:
    """True when a timestamp is stored in a coarser unit than the batch's."""
    if not (pa.types.is_timestamp(batch_type) and pa.types.is_timestamp(stored_type)):
        return False
    size = {"ns": 1, **{unit: n for unit, (n, _) in _UNITS.items()}}
    return size[stored_type.unit] > size[batch_type.unit]
