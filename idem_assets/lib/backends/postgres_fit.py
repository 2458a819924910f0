# pyarrow.compute builds its functions at import time, so a type checker cannot see them.
# pyright: reportAttributeAccessIssue=false
"""Which table column each batch column is stored in on PostgreSQL, decided on Arrow types.

A minimal, private schema fit: names match without regard to case, a type the stored type
holds every value of is cast in Arrow (timestamps floored to microseconds), anything else is
refused with the ``ALTER TABLE`` that makes it fit.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from idem_assets.lib.errors import SchemaMismatchError
from idem_assets.lib.identifiers import validate_identifier
from idem_assets.lib.settings import WriteSettings

Conversion = Literal["same", "cast"]


class TypeDialect(Protocol):
    """How an engine stores Arrow types and spells names."""

    engine: str

    def stored_type(self, batch_type: pa.DataType) -> pa.DataType:
        """The Arrow type a new column of ``batch_type`` reads back as once stored."""
        ...

    def type_sql(self, stored_type: pa.DataType) -> str:
        """The engine's SQL type for ``stored_type``."""
        ...

    def sql_name(self, name: str) -> str:
        """``name`` as a statement for the user spells it."""
        ...


@dataclass(frozen=True)
class ColumnFit:
    """One batch column and the table column it is stored in."""

    name: str
    type: pa.DataType
    stored_name: str
    stored_type: pa.DataType
    conversion: Conversion


def _holds(batch: pa.DataType, stored: pa.DataType) -> bool:
    """Whether every value of ``batch`` survives a cast to ``stored`` (timestamps floor)."""
    if batch == stored or pa.types.is_null(batch):
        return True
    if pa.types.is_integer(batch) and pa.types.is_integer(stored):
        return batch.bit_width < stored.bit_width or (
            batch.bit_width == stored.bit_width and pa.types.is_signed_integer(batch)
        )
    if pa.types.is_floating(batch) and pa.types.is_floating(stored):
        return batch.bit_width <= stored.bit_width
    if pa.types.is_timestamp(batch) and pa.types.is_timestamp(stored):
        return (batch.tz is None) == (stored.tz is None)
    if pa.types.is_date(batch) and pa.types.is_date(stored):
        return True
    return (pa.types.is_string(batch) or pa.types.is_large_string(batch)) and pa.types.is_string(
        stored
    )


def fit_columns(
    settings: WriteSettings,
    where: str,
    batch: pa.Schema,
    table: dict[str, pa.DataType] | None,
    dialect: TypeDialect,
) -> list[ColumnFit]:
    """Match the batch to the table (or to the table it creates), or refuse it."""
    for name in batch.names:
        validate_identifier(name, f"Refused to write {where}: batch column")
    by_name = {n.lower(): n for n in batch.names}
    needed = [settings.partition_expr] if settings.partition_expr else []
    needed += [*settings.primary_key, *settings.dedupe_order_by]
    absent = [c for c in dict.fromkeys(needed) if c.lower() not in by_name]
    if absent:
        raise SchemaMismatchError(
            f"Refused to write {where}: the batch has no column(s) {absent}, which the asset's"
            f" metadata names (partition_expr/primary_key/dedupe_order_by). Batch columns:"
            f" {batch.names}. Nothing was changed. Fix: add the column(s) to the batch, or"
            " correct the metadata."
        )
    if settings.partition_expr:
        ptype = batch.field(by_name[settings.partition_expr.lower()]).type
        if not (pa.types.is_date(ptype) or pa.types.is_timestamp(ptype)):
            p = settings.partition_expr
            raise SchemaMismatchError(
                f"Refused to write {where}: partition column '{p}' is {ptype}, not a date or"
                " timestamp, so window bounds would compare as text. Nothing was changed. Fix:"
                f" convert it, e.g. df['{p}'] = pd.to_datetime(df['{p}'])."
            )
    if table is None:
        untyped = [f.name for f in batch if pa.types.is_null(f.type)]
        if untyped:
            raise SchemaMismatchError(
                f"Refused to write {where}: column(s) {untyped} hold only NULL and have no type,"
                f" so table {settings.schema}.{settings.table} cannot be created from this batch."
                " Nothing was changed. Fix: give the column a type, e.g."
                f" df['{untyped[0]}'] = df['{untyped[0]}'].astype('float64')."
            )
        fits = []
        for f in batch:
            stored = dialect.stored_type(f.type)
            fits.append(ColumnFit(f.name, f.type, f.name, stored, _how(f.type, stored)))
        return fits
    table_by_name = {c.lower(): c for c in table}
    missing = [c for c in table if c.lower() not in by_name]
    extra = [f.name for f in batch if f.name.lower() not in table_by_name]
    fits, changed = [], []
    for f in batch:
        stored = table_by_name.get(f.name.lower())
        if stored is None:
            continue
        if _holds(f.type, table[stored]):
            fits.append(
                ColumnFit(f.name, f.type, stored, table[stored], _how(f.type, table[stored]))
            )
        else:
            changed.append((stored, table[stored], f.type))
    if missing or extra or changed:
        _refuse_mismatch(settings, where, batch, dialect, missing, extra, changed)
    return fits


def _how(batch: pa.DataType, stored: pa.DataType) -> Conversion:
    return "same" if batch == stored else "cast"


def _refuse_mismatch(
    settings: WriteSettings,
    where: str,
    batch: pa.Schema,
    dialect: TypeDialect,
    missing: Sequence[str],
    extra: Sequence[str],
    changed: Sequence[tuple[str, pa.DataType, pa.DataType]],
) -> None:
    target = f"{dialect.sql_name(settings.schema)}.{dialect.sql_name(settings.table)}"
    problems, statements = [], []
    if missing:
        problems.append(f"missing columns {list(missing)}")
        statements += [f"ALTER TABLE {target} DROP COLUMN {dialect.sql_name(c)}" for c in missing]
    if extra:
        problems.append(f"extra columns {list(extra)}")
        statements += [
            f"ALTER TABLE {target} ADD COLUMN {dialect.sql_name(c)}"
            f" {dialect.type_sql(dialect.stored_type(batch.field(c).type))}"
            for c in extra
        ]
    if changed:
        problems.append(
            "types that cannot hold every batch value ["
            + "; ".join(f"{c}: table {old}, batch {new}" for c, old, new in changed)
            + "]"
        )
        statements += [
            f"ALTER TABLE {target} ALTER COLUMN {dialect.sql_name(c)} TYPE"
            f" {dialect.type_sql(dialect.stored_type(new))}"
            for c, _, new in changed
        ]
    raise SchemaMismatchError(
        f"Refused to write {where}: the batch does not match table {target}: "
        + ", ".join(problems)
        + ". Nothing was changed. Fix: make the batch produce the table's columns and types;"
        " or, for an intended schema change, migrate the table first, then rerun: "
        + "; ".join(statements)
        + "."
    )


def stored_batch(batch: pa.Table, fits: Sequence[ColumnFit]) -> pa.Table:
    """The batch renamed and cast to the stored columns, timestamps floored to the stored unit."""
    columns = []
    for fit in fits:
        column = batch.column(fit.name)
        if fit.conversion != "same":
            if pa.types.is_timestamp(fit.type) and pa.types.is_timestamp(fit.stored_type):
                unit = {"s": "second", "ms": "millisecond", "us": "microsecond"}.get(
                    fit.stored_type.unit, "nanosecond"
                )
                column = pc.floor_temporal(column, unit=unit)
                column = column.cast(fit.stored_type, safe=False)
            else:
                column = column.cast(fit.stored_type)
        columns.append(column)
    return pa.Table.from_arrays(columns, names=[f.stored_name for f in fits])


def stage_batch(
    batch: pa.Table,
    settings: WriteSettings,
    where: str,
    table: dict[str, pa.DataType] | None,
    dialect: TypeDialect,
) -> tuple[list[ColumnFit], pa.Table]:
    """Fit the batch to the table and return it as it will be stored."""
    fits = fit_columns(settings, where, batch.schema, table, dialect)
    return fits, stored_batch(batch, fits)
