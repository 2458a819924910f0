"""Fit a batch to the table it is written into, or refuse it: the same steps on every engine.

The engine reports its table as a :class:`~idem_assets.lib.write.seam.Snapshot` and declares
what it stores differently as :class:`~idem_assets.lib.write.seam.Capabilities`; everything
decided from them (names, types, schema changes, rounding, text it cannot hold) is decided here,
with :mod:`idem_assets.lib.write.schema_fit`'s rules, before anything is staged.
"""

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

import pyarrow as pa

from idem_assets.lib.model.errors import SchemaMismatchError
from idem_assets.lib.model.settings import WriteSettings, spelt_partitions
from idem_assets.lib.write import schema_fit
from idem_assets.lib.write.schema_fit import ColumnFit, SchemaChange, TypeDialect
from idem_assets.lib.write.seam import Capabilities, Fitted, Rounding, Snapshot

#: A timestamp unit's fractional second digits.
UNIT_DIGITS = {"s": 0, "ms": 3, "us": 6, "ns": 9}


def fit(
    batch: pa.Table,
    settings: WriteSettings,
    where: str,
    snapshot: Snapshot,
    caps: Capabilities,
    values: Callable[[], Iterator[pa.Table]] | None = None,
) -> Fitted:
    """The batch's columns matched to the table's (or the table it creates), or a refusal.

    ``batch`` gives the columns (a probe, for a batch that stays in its engine); ``values``
    gives every row for the checks that count values, the batch itself by default.
    """
    rows = values or (lambda: iter([batch]))
    types = snapshot_types(snapshot, caps)
    if caps.max_name_bytes is not None:
        schema_fit.refuse_cut_names(
            settings, where, batch.column_names, caps.max_name_bytes, caps.engine
        )
    stored = snapshot.columns or {}
    unreadable = {c: col.sql for c, col in stored.items() if col.type is None}
    digits = {c: snapshot.numeric_digits[c] for c in unreadable if c in snapshot.numeric_digits}
    schema_fit.refuse_unreadable_columns(settings, where, batch.schema, unreadable, digits, types)
    table = snapshot.types()
    changes = schema_fit.schema_changes(settings, where, batch.schema, table, types)
    if table is not None and changes:
        refuse_changes_outside_write(settings, where, changes, table, caps, types)
        table = schema_fit.evolved(table, changes)
    fits = schema_fit.fit_columns(settings, where, batch.schema, table, types)
    schema_fit.refuse_lossy_values(rows, fits, settings, where, types)
    lengths = {c: (col.length, col.sql) for c, col in stored.items() if col.length is not None}
    schema_fit.refuse_unstorable_text(
        rows, fits, settings, where, types, lengths, holds_nul=caps.text_holds_nul
    )
    by_name = {f.name.lower(): f for f in fits}

    def spelt(names: Sequence[str]) -> tuple[str, ...]:
        return tuple(by_name[n.lower()].stored_name for n in names)

    spelt_settings = replace(
        spelt_partitions(settings, {n: f.stored_name for n, f in by_name.items()}),
        primary_key=spelt(settings.primary_key),
        dedupe_order_by=spelt(settings.dedupe_order_by),
    )
    added = [c.column for c in changes if c.action == "add_column"]
    order = (
        (*stored, *added) if snapshot.columns is not None else tuple(f.stored_name for f in fits)
    )
    return Fitted(
        settings=spelt_settings,
        columns=tuple(fits),
        changes=tuple(changes),
        rounds=roundings(fits, snapshot, caps, types),
        order=tuple(order),
    )


def snapshot_types(snapshot: Snapshot, caps: Capabilities) -> TypeDialect:
    """The type dialect of the snapshot's table (one that names the table), else the engine's."""
    return snapshot.types_dialect or caps.types


def roundings(
    fits: Sequence[ColumnFit], snapshot: Snapshot, caps: Capabilities, types: TypeDialect
) -> tuple[Rounding, ...]:
    """The timestamp columns the engine stores rounded to fewer fractional digits than sent.

    An engine that stages in Arrow floors instead (``caps.timestamps == "floor"``): a floor
    never crosses a window bound, so nothing rounds.
    """
    if caps.timestamps != "round":
        return ()
    stored = snapshot.columns or {}
    found = []
    for f in fits:
        if not (pa.types.is_timestamp(f.type) and pa.types.is_timestamp(f.stored_type)):
            continue
        column = stored.get(f.stored_name)
        digits = column.digits if column is not None and column.digits is not None else None
        if digits is None:
            digits = UNIT_DIGITS[f.stored_type.unit]
        if digits < UNIT_DIGITS[f.type.unit]:
            spelt = column.sql if column is not None else types.type_sql(f.stored_type)
            found.append(Rounding(f.name, f.stored_name, digits, spelt))
    return tuple(found)


def refuse_changes_outside_write(
    settings: WriteSettings,
    where: str,
    changes: Sequence[SchemaChange],
    table: dict[str, pa.DataType],
    caps: Capabilities,
    types: TypeDialect,
) -> None:
    """Refuse a change the asset opted into that the engine cannot make in the write's commit."""
    widened = [c for c in changes if c.action == "widen_type"]
    if "widen_type" in caps.schema_changes:
        widens = caps.widens
        widened = (
            [] if widens is None else [c for c in widened if not widens(table[c.column], c.type)]
        )
    if not widened:
        return
    listed = "; ".join(f"{c.column}: table {table[c.column]}, batch {c.type}" for c in widened)
    keeps = "'add_columns'" if settings.adds_columns else "'strict'"
    if "widen_type" in caps.schema_changes:
        # In place, the engine makes only some widenings: the others rewrite every row.
        raise SchemaMismatchError(
            f"Refused to write {where}: schema_evolution asks to widen [{listed}], but"
            f" {caps.engine} changes a column's type in place only {caps.widens_only}. Nothing"
            " was changed. Fix: cast the batch to the table's type (e.g. df['col'] ="
            " df['col'].astype(...)), or rewrite the table once with the wider type (every"
            f" row, in one commit) and set schema_evolution to {keeps}."
        )
    rewrite = (
        types.migration([], {}, {c.column: c.type for c in widened})
        if isinstance(types, schema_fit.MigratesInCode)
        else "; ".join(
            schema_fit.change_sql(f"{settings.schema}.{settings.table}", c, types) for c in widened
        )
    )
    raise SchemaMismatchError(
        f"Refused to write {where}: schema_evolution asks to widen [{listed}], but"
        f" {caps.engine} cannot change a column's type in the commit that"
        " writes the batch; only new columns can be added there. Nothing was changed. Fix:"
        " cast the batch to the table's type (e.g. df['col'] = df['col'].astype(...)), or"
        f" widen the table once (a rewrite of every row, in one commit: {rewrite}) and set"
        f" schema_evolution to {keeps}."
    )
